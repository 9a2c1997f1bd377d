package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// mdLink is a Markdown inline link's target: [text](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// brokenLinks returns what is wrong with each relative link of the
// Markdown file at path (relative to root): a file outside root or
// missing, or a #fragment that no heading of the target makes.
// read reads a file under root.
func brokenLinks(root, path string, read func(string) ([]byte, error)) []string {
	text, err := read(path)
	if err != nil {
		return []string{err.Error()}
	}
	var bad []string
	for _, m := range mdLink.FindAllStringSubmatch(stripCode(string(text)), -1) {
		target := m[1]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		file, frag, _ := strings.Cut(target, "#")
		dest := path
		if file != "" {
			dest = filepath.Join(filepath.Dir(path), file)
		}
		if !filepath.IsLocal(dest) {
			bad = append(bad, path+": "+target+": outside the repository")
			continue
		}
		body, err := read(dest)
		if err != nil {
			if info, serr := os.Stat(filepath.Join(root, dest)); serr == nil && info.IsDir() && frag == "" {
				continue
			}
			bad = append(bad, path+": "+target+": no such file")
			continue
		}
		if frag != "" && strings.HasSuffix(dest, ".md") && !slices.Contains(anchors(string(body)), frag) {
			bad = append(bad, path+": "+target+": no such heading")
		}
	}
	return bad
}

// stripCode drops fenced code blocks and inline code, where brackets and
// parentheses are not links.
func stripCode(s string) string {
	var out []string
	fence := false
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "```") {
			fence = !fence
			continue
		}
		if !fence {
			out = append(out, regexp.MustCompile("`[^`]*`").ReplaceAllString(l, ""))
		}
	}
	return strings.Join(out, "\n")
}

// anchors are the fragments GitHub makes of a Markdown file's headings:
// lower case, punctuation dropped, spaces as hyphens.
func anchors(s string) []string {
	var out []string
	fence := false
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "```") {
			fence = !fence
		}
		if fence || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(l, "#")))
		var b strings.Builder
		for _, r := range h {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && r != '—' && r != '×':
				b.WriteRune(r)
			}
		}
		out = append(out, b.String())
	}
	return out
}

func TestBrokenLinksFindsEachKind(t *testing.T) {
	files := map[string]string{
		"README.md":   "# Top\n## Peers behind NAT\n[ok](a/B.md) [ok](a/B.md#results-x) [ok](#peers-behind-nat) [dir](a)\n`[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n[web](https://example.org/x)\n",
		"a/B.md":      "# Results: X\n[up](../README.md#top)\n",
		"bad/Miss.md": "[gone](gone.md) [out](../../etc/passwd) [frag](../README.md#nope) [self](#missing)\n",
	}
	read := func(p string) ([]byte, error) {
		if s, ok := files[filepath.ToSlash(p)]; ok {
			return []byte(s), nil
		}
		return nil, fs.ErrNotExist
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		file string
		want int
	}{{"README.md", 0}, {"a/B.md", 0}, {"bad/Miss.md", 4}} {
		if got := brokenLinks(dir, tc.file, read); len(got) != tc.want {
			t.Errorf("%s: %q; want %d broken", tc.file, got, tc.want)
		}
	}
}

// Every relative link in every Markdown file of the repository resolves
// inside it, to a file and, for a #fragment, to a heading.
func TestMarkdownLinksResolve(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	read := func(p string) ([]byte, error) { return os.ReadFile(filepath.Join(root, p)) }
	var files []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(files, "README.md") {
		t.Fatalf("no README.md under %s", root)
	}
	for _, f := range files {
		for _, b := range brokenLinks(root, f, read) {
			t.Error(b)
		}
	}
}
