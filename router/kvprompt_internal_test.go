package router

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/kvcache"
	"github.com/infera/infera/openai"
)

// checkKeyTokenArray: keying a completions body whose prompt is the token
// array arr (hashed as the parse goes, sc.tokenArray) gives what parsing
// and then hashing gave: the same ids and, for every target's block size,
// AppendBlockHashes's hashes; an array AppendTokenIDs refuses is keyed by
// its text, as before.
func checkKeyTokenArray(t *testing.T, e *kvEnv, arr string) {
	t.Helper()
	body := `{"model":"m","prompt":` + arr + `}`
	var req openai.Request
	if err := openai.Scan([]byte(body), &req); err != nil {
		return // not a request the router sees
	}
	in := &PickInput{Route: RouteCompletions, Body: []byte(body), Request: &req}
	sc := new(kvScratch)
	for _, w := range e.cands().Workers {
		sc.targets = append(sc.targets, *w.PolicyState.(*kvWorker).targets.Load()...)
	}
	kind := e.p.keyPrompt(in, sc, nil)

	raw := []byte(body[req.Prompt.Start:req.Prompt.End])
	pr, perr := openai.FirstPrompt(raw)
	var ids []uint32
	err := perr
	if err == nil && pr.Kind == openai.PromptTokens {
		ids, err = openai.AppendTokenIDs(nil, pr.Raw)
	}
	if err != nil || pr.Kind != openai.PromptTokens {
		if kind != keyText {
			t.Fatalf("%s: kind %d, want text (%v)", arr, kind, err)
		}
		return
	}
	if kind != keyTokens || !slices.Equal(sc.tokens, ids) {
		t.Fatalf("%s: kind %d ids %v, want %v", arr, kind, sc.tokens, ids)
	}
	for _, tg := range sc.targets {
		bs := tg.blockSize()
		if got, want := sc.sets[sc.set(bs)].hashes, kvcache.AppendBlockHashes(nil, ids, bs); !slices.Equal(got, want) {
			t.Fatalf("%s bs %d: hashes %x, want %x", arr, bs, got, want)
		}
	}
}

func newTokenArrayEnv(t *testing.T) *kvEnv {
	bs := func(n int) func(*discovery.Record) {
		return func(r *discovery.Record) { r.KVBlockSize = &n }
	}
	return newKVEnv(t, kvConfig(func(*KVAwareConfig) {}), kvRecord(0, bs(4)), kvRecord(1, bs(4)), kvRecord(2, bs(3)), kvRecord(3, nil))
}

// TestKVKeyTokenArrayFused: the fused parse and hash against parsing then
// hashing, for arrays of every length around the block sizes, every
// separator style and malformed ones.
func TestKVKeyTokenArrayFused(t *testing.T) {
	e := newTokenArrayEnv(t)
	rng := rand.New(rand.NewPCG(9, 9))
	seps := []string{",", ", ", ",\n  ", " , "}
	for n := range 200 {
		var sb strings.Builder
		sb.WriteByte('[')
		sep := seps[n%len(seps)]
		for i := range n {
			if i > 0 {
				sb.WriteString(sep)
			}
			sb.WriteString(strconv.FormatUint(uint64(rng.Uint32N(200000)), 10))
		}
		sb.WriteByte(']')
		arr := sb.String()
		checkKeyTokenArray(t, e, arr)
		if n > 0 {
			// Broken at a random place: refused alike.
			k := rng.IntN(len(arr))
			checkKeyTokenArray(t, e, arr[:k]+"x"+arr[k+1:])
			checkKeyTokenArray(t, e, arr[:k]+"]")
		}
	}
	for _, arr := range []string{`[]`, `[[1,2,3,4,5]]`, `[4294967296,1,2,3]`, `[1,2,3,4,5,01]`, `"text"`, `[1,2,3,4,5,6,7,8,-1]`} {
		checkKeyTokenArray(t, e, arr)
	}
}

func FuzzKVKeyTokenArray(f *testing.F) {
	f.Add([]byte(`[1,2,3,4,5,6,7,8,9]`))
	f.Add([]byte(`[1, 22, 333,4444 ,55555]`))
	f.Fuzz(func(t *testing.T, arr []byte) {
		checkKeyTokenArray(t, newTokenArrayEnv(t), string(arr))
	})
}

// TestKVKeyTokenArrayAlloc: keying a token-array prompt with pooled
// scratch does not allocate.
func TestKVKeyTokenArrayAlloc(t *testing.T) {
	e := newTokenArrayEnv(t)
	body := []byte(`{"model":"m","prompt":[` + strings.Repeat("12345,", 999) + `7]}`)
	var req openai.Request
	if err := openai.Scan(body, &req); err != nil {
		t.Fatal(err)
	}
	in := &PickInput{Route: RouteCompletions, Body: body, Request: &req}
	sc := new(kvScratch)
	for _, w := range e.cands().Workers {
		sc.targets = append(sc.targets, *w.PolicyState.(*kvWorker).targets.Load()...)
	}
	run := func() {
		if e.p.keyPrompt(in, sc, nil) != keyTokens {
			t.Fatal("not keyed by tokens")
		}
		for _, tg := range sc.targets {
			sc.set(tg.blockSize())
		}
	}
	run()
	if n := testing.AllocsPerRun(50, run); n != 0 {
		t.Fatalf("%v allocs", n)
	}
}
