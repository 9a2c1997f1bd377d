# Reads netns-nat.sh output (make bench-nat), prints it, and then per kind
# of run (flat; behind NAT; behind NAT with JOIN_FLAGS named in its lines) the median formation time and how many ring
# links of the training jobs were direct.
{ print }
/formed in/ {
	kind = ($1 ~ /flat/) ? "flat" : ($2 ~ /reachability/) ? "NAT, --reachability private" : "NAT"
	for (i = 1; i <= NF; i++) if ($i == "in") t[kind, ++n[kind]] = $(i + 1)
}
/every link of every generation/ {
	kind = ($1 ~ /flat/) ? "flat" : ($2 ~ /reachability/) ? "NAT, --reachability private" : "NAT"
	for (i = 1; i < NF; i++) {
		if ($(i + 1) ~ /"link":"direct"/) direct[kind] += $i
		if ($(i + 1) ~ /"link":"(direct|relayed)"/) links[kind] += $i
	}
}
END {
	for (kind in n) {
		m = n[kind]
		for (i = 1; i <= m; i++) v[i] = t[kind, i]
		for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { x = v[i]; v[i] = v[j]; v[j] = x }
		med = (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
		printf "bench-nat %s: %d runs, ring formed in %.1f s (median), %d of %d links direct (%.1f%%)\n", kind, m, med, direct[kind], links[kind], links[kind] ? 100 * direct[kind] / links[kind] : 0
	}
}
