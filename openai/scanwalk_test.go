package openai_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/infera/infera/jsonx"
	"github.com/infera/infera/openai"
)

// walkEdits are edit lists as the router's PD legs make them (set,
// added, deleted, only where present).
var walkEdits = [][]jsonx.Field{
	{{Key: "kv_transfer_params", Value: []byte(`{"do_remote_decode":true}`)}, {Key: "_infera_retention", Value: []byte(`"long"`)}, {Key: "max_tokens", Value: []byte(`1`)}, {Key: "stream", Value: []byte(`false`)}, {Key: "stream_options"}},
	{{Key: "max_tokens", Value: []byte(`1`), Existing: true}, {Key: "model", Value: []byte(`"x"`)}},
	{{Key: "model"}, {Key: "messages"}},
	{},
}

// editDepths are the bounds the walk is used under: the router's legs'
// (64), Scan's own, one below a body's nesting, none.
var editDepths = []int{64, openai.MaxDepth, 3, 0}

// checkScanWalk: where Scan with a Walk accepts body, every edit spliced
// from that walk is SetFields' bytes and error; where it rejects body,
// the walk holds nothing (the edit walks body itself, the same bytes).
func checkScanWalk(t *testing.T, body []byte) {
	t.Helper()
	var plain openai.Request
	perr := openai.Scan(body, &plain)
	var w jsonx.Walk
	r := openai.Request{Walk: &w}
	if err := openai.Scan(body, &r); fmt.Sprint(err) != fmt.Sprint(perr) {
		t.Fatalf("%q: Scan with a walk: %v, without: %v", body, err, perr)
	}
	for _, depth := range editDepths {
		for _, fields := range walkEdits {
			want, werr := jsonx.SetFields(nil, body, fields, depth)
			got, err := jsonx.SetFieldsWalk(nil, body, fields, depth, r.Walk)
			if fmt.Sprint(err) != fmt.Sprint(werr) || string(got) != string(want) {
				t.Fatalf("%q depth %d %v: spliced %q, %v; SetFields %q, %v", body, depth, fields, got, err, want, werr)
			}
		}
	}
}

func TestScanWalk(t *testing.T) {
	deep := `{"model":"m","a":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`
	many := `{"model":"m"`
	for i := range 70 {
		many += `,"k` + strconv.Itoa(i) + `":` + strconv.Itoa(i)
	}
	many += `}`
	for _, body := range []string{
		chatBody,
		` { "model" : "m", "stream":true, "m\u006fdel":"dup", "stream_options" : {"include_usage":true}, "max_tokens":16 , "messages":[{"role":"user"}] } ` + "\n",
		`{"model":"m","kv_transfer_params":{"infera_retention":"x"},"kv_transfer_params":2,"max_tokens":3}`,
		`{"model":"m","a":[[1]]}`, deep, many,
		// Rejected: the walk must hold nothing.
		`{"model":"m","a":}`, `{"model":1}`, `{"stream":true}`, `[]`, `{"model":"m"} x`, "{\"model\":\"\xff\"}",
	} {
		checkScanWalk(t, []byte(body))
	}
}

// The edit splices from Scan's walk rather than walking the body again:
// bytes changed after Scan (which a caller must not do) show through.
func TestScanWalkIsSpliced(t *testing.T) {
	body := []byte(`{"model":"m","b":22}`)
	var w jsonx.Walk
	r := openai.Request{Walk: &w}
	if err := openai.Scan(body, &r); err != nil {
		t.Fatal(err)
	}
	copy(body, `{"model":"m","b":2 }`)
	set := []jsonx.Field{{Key: "model", Value: []byte(`"x"`)}}
	got, err := jsonx.SetFieldsWalk(nil, body, set, 64, &w)
	if err != nil || string(got) != `{"model":"x","b":2 }` {
		t.Fatalf("after Scan: %q, %v; want the members spliced from Scan's spans", got, err)
	}
	// Reset keeps the Walk; the next Scan records afresh.
	r.Reset()
	if r.Walk != &w {
		t.Fatal("Reset dropped the Walk")
	}
	if err := openai.Scan(body, &r); err != nil {
		t.Fatal(err)
	}
	if got, err = jsonx.SetFieldsWalk(nil, body, set, 64, &w); err != nil || string(got) != `{"model":"x","b":2}` {
		t.Fatalf("after a second Scan: %q, %v", got, err)
	}
	// A rejected body leaves nothing held.
	if err := openai.Scan([]byte(`{"model":""}`), &r); !errors.Is(err, openai.ErrMissingModel) {
		t.Fatal(err)
	}
	copy(body, `{"model":"m","b":22}`)
	if got, err = jsonx.SetFieldsWalk(nil, body, set, 64, &w); err != nil || string(got) != `{"model":"x","b":22}` {
		t.Fatalf("after a rejected Scan: %q, %v", got, err)
	}
}

func FuzzScanWalk(f *testing.F) {
	for _, s := range []string{
		chatBody, `{"model":"m","prompt":[1,2]}`, `{"a":[[[[{}]]]]}`, `{"m\u006fdel":"x","model":null}`,
		`{"model":"m","kv_transfer_params":{"a":1},"stream":true}`, ` {"model" : "m" } `, `{"model":"m","a":[[[{"b":[1]}]]]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkScanWalk(t, body)
	})
}
