package engargs_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/infera/infera/engargs"
)

func TestIsFlagAndSplit(t *testing.T) {
	for arg, want := range map[string]bool{
		"--port": true, "-tp": true, "--x=1": true, "-1": false, "-0.5": false, "-1e3": false,
		"--": false, "-": false, "model": false, "": false, "-inf": false, "--1": true,
	} {
		if got := engargs.IsFlag(arg); got != want {
			t.Errorf("IsFlag(%q) = %v, want %v", arg, got, want)
		}
	}
	for _, tc := range []struct{ arg, name, value string }{
		{"--max_model_len=4k", "max-model-len", "4k"},
		{"-data_parallel_size", "data-parallel-size", ""},
		{"--kv_events_config.replay_endpoint", "kv-events-config.replay_endpoint", ""},
		{"--host=a_b", "host", "a_b"},
	} {
		name, value, _, ok := engargs.Split(tc.arg)
		if !ok || name != tc.name || value != tc.value {
			t.Errorf("Split(%q) = %q %q %v", tc.arg, name, value, ok)
		}
	}
}

func TestWalkStopsAtDashesAndTakesNegativeValues(t *testing.T) {
	args := []string{"--seed", "-1", "--port=9", "-1.5", "--", "--port", "10"}
	var got []string
	err := engargs.Walk(args, engargs.Names("seed", "port"), func(f engargs.Flag) error {
		got = append(got, fmt.Sprintf("%s=%s@%d", f.Name, f.Value, f.At))
		return nil
	})
	if err != nil || !slices.Equal(got, []string{"seed=-1@1", "port=9@2"}) {
		t.Fatalf("walk %v %v", got, err)
	}
	if err := engargs.Walk([]string{"--port"}, engargs.Names("port"), func(engargs.Flag) error { return nil }); !errors.Is(err, engargs.ErrArgs) {
		t.Fatalf("missing value: %v", err)
	}
}

func TestParseJSONMergesDottedKeys(t *testing.T) {
	args := []string{"--kv-events-config", `{"a":1}`, "--kv_events_config={\"k\":\"v\"}", "--kv-events-config.x.y", "2", "--kv-events-config.s", "text"}
	j, err := engargs.ParseJSON(args, "kv-events-config")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(j.Obj) != "map[k:v s:text x:map[y:2]]" || !j.Present || !j.Dotted || j.At != 2 || !j.Inline || j.Keys != 1 {
		t.Fatalf("%+v", j)
	}
	for _, bad := range [][]string{{"--kv-events-config", "[1]"}, {"--kv-events-config.", "1"}, {"--kv-events-config.a..b", "1"}, {"--kv-events-config", "{} x"}} {
		if _, err := engargs.ParseJSON(bad, "kv-events-config"); !errors.Is(err, engargs.ErrArgs) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if j, err := engargs.ParseJSON([]string{"--", "--kv-events-config", "{}"}, "kv-events-config"); err != nil || j.Present {
		t.Errorf("after --: %+v %v", j, err)
	}
}

// FuzzParseJSON: any command line either parses or fails with ErrArgs,
// without panicking.
func FuzzParseJSON(f *testing.F) {
	f.Add("--kv-events-config", `{"endpoint":"tcp://*:5557"}`, "--kv-events-config.topic", "kv")
	f.Add("--kv_events_config.a.b", "1", "--", "-1")
	f.Fuzz(func(t *testing.T, a, b, c, d string) {
		j, err := engargs.ParseJSON([]string{a, b, c, d}, "kv-events-config")
		if err != nil && !errors.Is(err, engargs.ErrArgs) {
			t.Fatalf("error %v does not wrap ErrArgs", err)
		}
		if err == nil && j.Present && j.Obj == nil {
			t.Fatalf("present without an object: %+v", j)
		}
	})
}
