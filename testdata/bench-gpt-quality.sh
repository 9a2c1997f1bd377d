#!/usr/bin/env bash
# The GPT's validation loss against PyTorch's at the same step, with
# torch_gpt.py's settings (batch 32, context 128, AdamW lr 1e-3, betas
# (0.9, 0.95), weight decay 0.1) for 1,124 steps — two of ringtrain's
# epochs of fortunes — each scored every 281 steps: PyTorch
# (torch_gpt.py --threads 2), ringtrain on one peer of batch 32, and the
# same global batch over 4 peers of batch 8. Each ringtrain checkpoint is
# then scored on torch_gpt.py's own 64 validation windows (GPTEVAL, the
# build of internal/gpteval), the measure PyTorch's figure is on; the
# curves go into OUT/gpt-curves.png (ringtrain's scores there are over
# every window of the validation part).
# GPT_TORCH_LOG names a torch_gpt.py output of those settings to use
# instead of running it again (its 15 minutes here).
#   bash testdata/bench-gpt-quality.sh RINGTRAIN GPTEVAL TORCH_GPT OUT
set -euo pipefail
rt=$(realpath "$1") gpteval=$(realpath "$2") torch=$3 out=$4
here=$(cd "$(dirname "$0")" && pwd)
corpus=/usr/share/games/fortunes
steps=1124 every=281
mkdir -p "$out"
if [ -n "${GPT_TORCH_LOG:-}" ]; then
	grep '^{' "$GPT_TORCH_LOG" >"$out/torch.jsonl"
else
	/usr/bin/python3 "$torch" --threads 2 --steps $steps --eval-every $every >"$out/torch.jsonl"
fi
torch_loss=$(grep -o '"val_loss": [0-9.]*' "$out/torch.jsonl" | tail -1 | grep -o '[0-9.]*$')
printf '%-22s %s\n' "PyTorch" "$torch_loss"
for peers in 1 4; do
	dir=$out/ringtrain-$peers
	rm -rf "$dir" && mkdir -p "$dir"
	sed -e "s/\"world_size\": 1/\"world_size\": $peers/" -e "s/\"batch_size\": 32/\"batch_size\": $((32 / peers))/" \
		-e "s#\"seed\": 1,#\"seed\": 1, \"eval_every\": $every, \"checkpoint_dir\": \"$dir\",#" \
		"$here/gpt-quality-job.json" >"$dir/job.json"
	"$rt" local -n $peers --threads $((peers == 1 ? 2 : 1)) --config "$dir/job.json" --log-format json --log-dir "$dir/logs" >"$dir/out.txt" 2>&1
	loss=$("$gpteval" "$dir/gpt-quality.ckpt" "$corpus" | grep -o '"val_loss": [0-9.]*' | grep -o '[0-9.]*$')
	printf '%-22s %s  (%+.1f%%)\n' "ringtrain $peers×$((32 / peers))" "$loss" "$(awk -v a="$loss" -v b="$torch_loss" 'BEGIN{print (a / b - 1) * 100}')"
done
"$rt" plot --by file "PyTorch=$out/torch.jsonl" "ringtrain 1×32=$out/ringtrain-1/logs/peer-0.jsonl" \
	"ringtrain 4×8=$out/ringtrain-4/logs/peer-0.jsonl" -o "$out/gpt-curves.png"
