package main

// framepack models: what a Hugging Face cache holds of the pipeline's repositories.
//
//	framepack models [--cache DIR] [--revision main]
//	framepack models verify [--cache DIR] [--revision main] [--remove-bad]
//
// models lists each repository (revision, commit, size on disk, complete or what is missing)
// and which pipeline variants can run from the cache. verify re-hashes every file of each
// repository's snapshot against the ETag its blob is named by (sha256 for LFS files, the git
// blob sha1 for the others) and exits 1 when a file is bad; --remove-bad deletes bad files so
// that `framepack pull` downloads them again.

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/framepackd/framepackd/internal/hfhub"
)

func cmdModels(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 && args[0] == "verify" {
		return cmdModelsVerify(ctx, e, args[1:])
	}
	var h hubFlags
	fs := newHubFlags("models", e, &h)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fail(exitUsage, "models: unexpected arguments %q (the one subcommand is verify)", pos)
	}
	cache := hfhub.Cache{Root: h.cacheDir(hfhub.FromEnv())}
	installed, err := cache.Scan()
	if err != nil {
		return fail(exitError, "%v", err)
	}
	byRepo := map[string]hfhub.Installed{}
	for _, in := range installed {
		byRepo[in.Repo] = in
	}
	statuses := cache.Status(h.revision)
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REPOSITORY\tREVISION\tCOMMIT\tSIZE\tSTATE")
	for _, s := range statuses {
		in, ok := byRepo[s.Spec.Repo]
		rev, size := "-", "-"
		if ok {
			size = hfhub.Bytes(in.Size)
			if in.Partial > 0 {
				size += fmt.Sprintf(" (+%s partial)", hfhub.Bytes(in.Partial))
			}
			var names []string
			for name, c := range in.Refs {
				if c == s.Commit {
					names = append(names, name)
				}
			}
			if len(names) > 0 {
				sort.Strings(names)
				rev = strings.Join(names, ",")
			}
		}
		state := "complete"
		switch {
		case s.Dir == "":
			state = "missing"
		case len(s.Missing) > 0:
			state = fmt.Sprintf("incomplete: %d missing (%s)", len(s.Missing), listSome(s.Missing, 3))
		}
		commit := "-"
		if s.Commit != "" {
			commit = shortCommit(s.Commit)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Spec.Repo, rev, commit, size, state)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	complete := hfhub.VariantComplete(statuses)
	var vs []string
	for _, v := range hfhub.VariantNames() {
		if complete[v] {
			vs = append(vs, v+" complete")
		} else {
			vs = append(vs, fmt.Sprintf("%s incomplete (framepack pull --variant %s)", v, v))
		}
	}
	fmt.Fprintf(e.stdout, "\nvariants: %s\ncache: %s\n", strings.Join(vs, ", "), cache.Root)
	if others := len(installed) - countKnown(installed); others > 0 {
		fmt.Fprintf(e.stdout, "(%d other repositories in the cache)\n", others)
	}
	return nil
}

func countKnown(in []hfhub.Installed) int {
	known := map[string]bool{}
	for _, s := range hfhub.KnownRepos() {
		known[s.Repo] = true
	}
	n := 0
	for _, i := range in {
		if known[i.Repo] {
			n++
		}
	}
	return n
}

// listSome joins the first n items, saying how many more there are.
func listSome(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:n], ", ") + fmt.Sprintf(", … %d more", len(items)-n)
}

func cmdModelsVerify(ctx context.Context, e *env, args []string) error {
	var h hubFlags
	fs := newHubFlags("models verify", e, &h)
	removeBad := fs.Bool("remove-bad", false, "delete bad files so that framepack pull downloads them again")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fail(exitUsage, "models verify: unexpected arguments %q", pos)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	cache := hfhub.Cache{Root: h.cacheDir(hfhub.FromEnv())}
	var bad, checked int
	for _, s := range cache.Status(h.revision) {
		if s.Dir == "" {
			continue
		}
		checked++
		res, err := cache.Verify(ctx, s.Spec.Repo, s.Commit, nil)
		if err != nil {
			return fail(exitError, "%v", err)
		}
		state := "ok"
		if len(res.Bad) > 0 {
			state = fmt.Sprintf("%d BAD", len(res.Bad))
		}
		fmt.Fprintf(e.stdout, "%s @ %s: %d files, %s verified: %s\n", s.Spec.Repo, shortCommit(s.Commit), res.Files, hfhub.Bytes(res.Bytes), state)
		for _, b := range res.Bad {
			fmt.Fprintf(e.stdout, "  bad: %s (blob %s): %s\n", b.Path, b.Blob, b.Problem)
		}
		if len(res.Unverifiable) > 0 {
			fmt.Fprintf(e.stdout, "  not verifiable (not links to hash-named blobs): %s\n", listSome(res.Unverifiable, 5))
		}
		bad += len(res.Bad)
		if len(res.Bad) > 0 && *removeBad {
			if err := cache.RemoveBad(s.Commit, res.Bad); err != nil {
				return fail(exitError, "remove bad files: %v", err)
			}
			fmt.Fprintf(e.stdout, "  removed %d bad files; run framepack pull to download them again\n", len(res.Bad))
		}
	}
	if checked == 0 {
		return fail(exitError, "models verify: none of the pipeline's repositories is in %s", cache.Root)
	}
	if bad > 0 {
		hint := "run framepack models verify --remove-bad, then framepack pull"
		if *removeBad {
			hint = "run framepack pull to download them again"
		}
		return fail(exitError, "%d bad files: %s", bad, hint)
	}
	return nil
}
