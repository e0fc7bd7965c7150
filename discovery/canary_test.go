package discovery_test

import (
	"encoding/json"
	"testing"

	"github.com/infera/infera/discovery"
)

func canaryRec(id, model, kv string) discovery.Record {
	r := discovery.Record{WorkerID: id, URL: "http://" + id, ModelName: model, Engine: "vllm", DPSize: 1, Status: discovery.StatusActive}
	if kv != "" {
		r.KV = json.RawMessage(kv)
	}
	return r
}

func canaryIDs(s *discovery.Snapshot) []string {
	var out []string
	for _, w := range s.Workers {
		out = append(out, w.WorkerID)
	}
	return out
}

// The reference's rule: the first worker of a model sets the canary; a
// worker of that model with another canary is rejected and counted once;
// workers without a canary, and other models, are not checked; the
// reference is forgotten when the model has no worker left.
func TestCanaryCheck(t *testing.T) {
	var rejected []string
	c := discovery.NewCanaryCheck(func(rec *discovery.Record, first string) {
		rejected = append(rejected, rec.WorkerID+"≠"+first)
	})
	a := canaryRec("a:1", "m", `{"tokenizer_canary":[1,2,3]}`)
	b := canaryRec("b:1", "m", `{"tokenizer_canary": [1, 2, 3], "tiers": ["device"]}`)
	bad := canaryRec("c:1", "m", `{"tokenizer_canary":[1,2,4]}`)
	none := canaryRec("d:1", "m", `{"tiers":["device"]}`)
	other := canaryRec("e:1", "n", `{"tokenizer_canary":[9]}`)

	s1 := &discovery.Snapshot{Revision: 1, Workers: []discovery.Record{a}}
	if got := c.Filter(s1); got != s1 {
		t.Fatalf("a clean snapshot was copied: %v", canaryIDs(got))
	}
	s2 := &discovery.Snapshot{Revision: 2, Workers: []discovery.Record{a, b, bad, none, other}}
	got := c.Filter(s2)
	if want := []string{"a:1", "b:1", "d:1", "e:1"}; !equal(canaryIDs(got), want) || got.Revision != 2 {
		t.Fatalf("filtered %v, want %v", canaryIDs(got), want)
	}
	if len(s2.Workers) != 5 {
		t.Fatal("Filter modified its input")
	}
	c.Filter(&discovery.Snapshot{Revision: 3, Workers: []discovery.Record{a, b, bad, none, other}})
	if n := c.Rejections(); n != 1 || len(rejected) != 1 || rejected[0] != "c:1≠a:1" {
		t.Fatalf("rejections %d %v, want c:1 once", n, rejected)
	}
	// Every worker of m gone: the next first one sets a new reference.
	c.Filter(&discovery.Snapshot{Revision: 4, Workers: []discovery.Record{other}})
	if got := c.Filter(&discovery.Snapshot{Revision: 5, Workers: []discovery.Record{bad, other}}); len(got.Workers) != 2 {
		t.Fatalf("new reference: %v", canaryIDs(got))
	}
	if got := c.Filter(&discovery.Snapshot{Revision: 6, Workers: []discovery.Record{a, bad, other}}); !equal(canaryIDs(got), []string{"c:1", "e:1"}) {
		t.Fatalf("after the new reference: %v", canaryIDs(got))
	}
	if n := c.Rejections(); n != 2 {
		t.Fatalf("rejections %d, want 2", n)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// FuzzCanaryCheck: any kv blocks (records come from etcd) filter without
// panicking, never grow the snapshot and never drop a worker without a
// canary.
func FuzzCanaryCheck(f *testing.F) {
	f.Add(`{"tokenizer_canary":[1,2,3]}`, `{"tokenizer_canary":[1,2,4]}`, `{}`)
	f.Add(`{"tokenizer_canary":"x"}`, `null`, `{"tokenizer_canary":[1e99]}`)
	f.Fuzz(func(t *testing.T, a, b, c string) {
		check := discovery.NewCanaryCheck(nil)
		snap := &discovery.Snapshot{Revision: 1, Workers: []discovery.Record{
			canaryRec("a:1", "m", a), canaryRec("b:1", "m", b), canaryRec("c:1", "m", c), canaryRec("d:1", "m", ""),
		}}
		for range 2 {
			got := check.Filter(snap)
			if len(got.Workers) > len(snap.Workers) || len(got.Workers) == 0 {
				t.Fatalf("filtered %v", canaryIDs(got))
			}
			if got.Workers[len(got.Workers)-1].WorkerID != "d:1" {
				t.Fatalf("the worker without a canary was dropped: %v", canaryIDs(got))
			}
		}
	})
}
