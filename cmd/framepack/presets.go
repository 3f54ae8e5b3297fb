package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// cmdPresets is `framepack presets save NAME [settings flags] | list | show NAME | rm NAME…`.
func cmdPresets(ctx context.Context, e *env, args []string) error {
	sub, rest := subcommand(args)
	switch sub {
	case "save":
		return presetSave(ctx, e, rest)
	case "list", "ls":
		return presetList(ctx, e, rest)
	case "show":
		return presetShow(ctx, e, rest)
	case "rm", "delete":
		return presetRm(ctx, e, rest)
	}
	return fail(exitUsage, "presets: want save NAME [settings flags], list, show NAME or rm NAME…")
}

// subcommand finds a command's subcommand after the global flags (--addr, --timeout) that run
// puts first, and returns it and the other arguments.
func subcommand(args []string) (string, []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && (name == "addr" || name == "timeout") {
			if !hasValue {
				i++
			}
			continue
		}
		if strings.HasPrefix(a, "-") {
			return "", args
		}
		return a, append(append([]string(nil), args[:i]...), args[i+1:]...)
	}
	return "", args
}

func presetSave(ctx context.Context, e *env, args []string) error {
	var c common
	fs := newFlags("presets save", e, &c)
	var sf specFlags
	sf.register(fs)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fail(exitUsage, "presets save: want one name, then the settings as flags (framepack presets save fast --steps 12 --cache magcache)")
	}
	if sf.preset != "" {
		return fail(exitUsage, "presets save: --preset does not nest; give the settings themselves")
	}
	if !sf.anyGiven() {
		return fail(exitUsage, "presets save: no settings given: a preset holds the settings flags given with it (--steps, --cache, …)")
	}
	spec, err := sf.spec("presets save")
	if err != nil {
		return err
	}
	sf.keepGiven(spec)
	return withClient(ctx, e, &c, func(ctx context.Context, cl framepackv1.PresetServiceClient) error {
		resp, err := cl.SavePreset(ctx, &framepackv1.SavePresetRequest{Preset: &framepackv1.Preset{Name: pos[0], Spec: spec}})
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "saved preset %q: %s\n", resp.GetPreset().GetName(), presetSummary(resp.GetPreset().GetSpec()))
		return nil
	})
}

func presetList(ctx context.Context, e *env, args []string) error {
	var c common
	fs := newFlags("presets list", e, &c)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return fail(exitUsage, "presets list: unexpected arguments %q", pos)
	}
	return withClient(ctx, e, &c, func(ctx context.Context, cl framepackv1.PresetServiceClient) error {
		resp, err := cl.ListPresets(ctx, &framepackv1.ListPresetsRequest{})
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tSETTINGS")
		for _, p := range resp.GetPresets() {
			fmt.Fprintf(tw, "%s\t%s\n", p.GetName(), presetSummary(p.GetSpec()))
		}
		return tw.Flush()
	})
}

func presetShow(ctx context.Context, e *env, args []string) error {
	var c common
	fs := newFlags("presets show", e, &c)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fail(exitUsage, "presets show: want one name")
	}
	return withClient(ctx, e, &c, func(ctx context.Context, cl framepackv1.PresetServiceClient) error {
		resp, err := cl.GetPreset(ctx, &framepackv1.GetPresetRequest{Name: pos[0]})
		if err != nil {
			return err
		}
		b, err := protojson.Marshal(resp.GetPreset())
		if err != nil {
			return err
		}
		// Indented here: protojson's own spacing varies from build to build on purpose.
		var out bytes.Buffer
		if err := json.Indent(&out, b, "", "  "); err != nil {
			return err
		}
		fmt.Fprintln(e.stdout, out.String())
		return nil
	})
}

func presetRm(ctx context.Context, e *env, args []string) error {
	var c common
	fs := newFlags("presets rm", e, &c)
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return fail(exitUsage, "presets rm: want one name or more")
	}
	return withClient(ctx, e, &c, func(ctx context.Context, cl framepackv1.PresetServiceClient) error {
		for _, name := range pos {
			if _, err := cl.DeletePreset(ctx, &framepackv1.DeletePresetRequest{Name: name}); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "removed preset %q\n", name)
		}
		return nil
	})
}

// withClient dials the server and runs fn with a PresetService client under the request timeout.
func withClient(ctx context.Context, e *env, c *common, fn func(context.Context, framepackv1.PresetServiceClient) error) error {
	conn, err := dial(e, c)
	if err != nil {
		return err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	return fn(cctx, framepackv1.NewPresetServiceClient(conn))
}

// presetSummary is a preset's settings on one line: name=value for each field it sets, in the
// spec's field order.
func presetSummary(spec *framepackv1.JobSpec) string {
	var parts []string
	spec.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		val := v.String()
		switch {
		case fd.IsList():
			var items []string
			for i := range v.List().Len() {
				item := v.List().Get(i)
				if fd.Message() != nil {
					items = append(items, "{"+strings.Join(strings.Fields(fmt.Sprint(item.Message().Interface())), " ")+"}")
				} else {
					items = append(items, fmt.Sprint(item.Interface()))
				}
			}
			val = "[" + strings.Join(items, " ") + "]"
		case fd.Kind() == protoreflect.StringKind && strings.ContainsAny(val, " \t"):
			val = strconv.Quote(val)
		}
		parts = append(parts, string(fd.Name())+"="+val)
		return true
	})
	return strings.Join(parts, " ")
}
