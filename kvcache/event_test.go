package kvcache

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// mp encodes v with the msgpack library, the way engines' msgspec encoders
// lay values out (maps stay maps, slices arrays, []byte bin, ints in their
// smallest encoding).
func mp(t testing.TB, v any) []byte {
	t.Helper()
	return mpWith(t, v, true)
}

func mpWith(t testing.TB, v any, compact bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	enc.UseCompactInts(compact)
	if err := enc.Encode(v); err != nil {
		t.Fatalf("encode: %v", err)
	}
	return buf.Bytes()
}

// vLLM / SGLang msgspec array_like events.
func arrStored(hashes, parent, tokens any, blockSize int, rest ...any) []any {
	return append([]any{"BlockStored", hashes, parent, tokens, blockSize}, rest...)
}

func arrRemoved(hashes any, rest ...any) []any {
	return append([]any{"BlockRemoved", hashes}, rest...)
}

func decodeOK(t *testing.T, payload []byte) *Batch {
	t.Helper()
	var b Batch
	if err := NewDecoder().Decode(payload, &b); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return &b
}

func TestDecodeVLLMArray(t *testing.T) {
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	payload := mp(t, []any{
		1712345678.25,
		[]any{
			// vLLM v0.10+: all fields, medium "GPU", lora_name nil,
			// extra_keys all nil.
			arrStored([]uint64{11, 0xFFFFFFFFFFFFFFFF}, nil, tokens, 4, nil, "GPU", nil, []any{nil, nil}),
			arrStored([]uint64{13}, uint64(0xFFFFFFFFFFFFFFFF), []uint32{9, 10, 11, 12}, 4, nil, "GPU"),
			arrRemoved([]uint64{11}, "GPU"),
			[]any{"AllBlocksCleared"},
		},
		2,
	})
	b := decodeOK(t, payload)
	if b.TS != 1712345678.25 || !b.HasDPRank || b.DPRank != 2 || len(b.Events) != 4 {
		t.Fatalf("batch: ts %v rank %v/%v events %d", b.TS, b.DPRank, b.HasDPRank, len(b.Events))
	}
	e := b.Events[0]
	if e.Type != EventBlockStored || !slices.Equal(e.Hashes, []uint64{11, 0xFFFFFFFFFFFFFFFF}) || e.HasParent ||
		!slices.Equal(e.Tokens, tokens) || e.BlockSize != 4 || e.Ignore != IgnoreNone {
		t.Fatalf("event 0: %+v", e)
	}
	e = b.Events[1]
	if !e.HasParent || e.Parent != 0xFFFFFFFFFFFFFFFF || !slices.Equal(e.Tokens, []uint32{9, 10, 11, 12}) {
		t.Fatalf("event 1: %+v", e)
	}
	if e := b.Events[2]; e.Type != EventBlockRemoved || !slices.Equal(e.Hashes, []uint64{11}) || e.Ignore != IgnoreNone {
		t.Fatalf("event 2: %+v", e)
	}
	if b.Events[3].Type != EventAllBlocksCleared {
		t.Fatalf("event 3: %+v", b.Events[3])
	}
}

func TestDecodeSGLangArray(t *testing.T) {
	// SGLang: hash(tuple(tokens)) is a signed 64-bit int; trailing fields
	// (medium…) omitted; no dp_rank element.
	payload := mp(t, []any{
		int64(17),
		[]any{
			arrStored([]int64{-5}, nil, []int64{100, 101}, 2, nil),
			arrStored([]int64{-6, 1 << 62}, int64(-5), []int64{102, 103, 104, 105}, 2),
			arrRemoved([]int64{-6}),
		},
	})
	b := decodeOK(t, payload)
	if b.HasDPRank || len(b.Events) != 3 {
		t.Fatalf("batch: %+v", b)
	}
	if got := b.Events[0].Hashes[0]; got != uint64(0xFFFFFFFFFFFFFFFB) {
		t.Fatalf("negative hash: %#x", got)
	}
	if e := b.Events[1]; e.Parent != uint64(0xFFFFFFFFFFFFFFFB) || e.Hashes[1] != 1<<62 || len(e.Tokens) != 4 {
		t.Fatalf("event 1: %+v", e)
	}
	if e := b.Events[2]; e.Hashes[0] != uint64(0xFFFFFFFFFFFFFFFA) {
		t.Fatalf("event 2: %+v", e)
	}
}

func TestDecodeVLLMMapWithUnknownFields(t *testing.T) {
	payload := mp(t, map[string]any{
		"ts":                 3.5,
		"data_parallel_rank": 1,
		"publisher":          map[string]any{"nested": []any{1, []any{2, "x"}}},
		"events": []any{
			map[string]any{
				"type":               "BlockStored",
				"block_hashes":       []uint64{1, 2},
				"parent_block_hash":  nil,
				"token_ids":          []uint32{1, 2, 3, 4},
				"block_size":         2,
				"lora_id":            nil,
				"medium":             "GPU",
				"lora_name":          nil,
				"extra_keys":         nil,
				"group_idx":          0,
				"kv_cache_spec_kind": "full_attention",
				"future_field":       map[string]any{"a": []any{1.5, true, nil}},
			},
			map[string]any{"type": "BlockRemoved", "block_hashes": []uint64{2}, "medium": nil, "group_idx": 0, "whatever": "x"},
			map[string]any{"type": "AllBlocksCleared", "medium": "GPU"},
		},
	})
	b := decodeOK(t, payload)
	if b.TS != 3.5 || b.DPRank != 1 || len(b.Events) != 3 {
		t.Fatalf("batch: %+v", b)
	}
	e := b.Events[0]
	if e.Type != EventBlockStored || !slices.Equal(e.Hashes, []uint64{1, 2}) || !e.HasGroup || e.Group != 0 ||
		e.Ignore != IgnoreNone || e.BlockSize != 2 {
		t.Fatalf("event 0: %+v", e)
	}
	if e := b.Events[1]; e.Type != EventBlockRemoved || !e.HasGroup || e.Hashes[0] != 2 {
		t.Fatalf("event 1: %+v", e)
	}
}

func TestDecodeATOMBytesHashes(t *testing.T) {
	// 32-byte sha256-style hashes: the low 8 bytes, big-endian.
	h1 := bytes.Repeat([]byte{0xAA}, 24)
	h1 = append(h1, 1, 2, 3, 4, 5, 6, 7, 8)
	parent := []byte{0x01, 0x02} // shorter than 8 bytes: a big-endian integer
	payload := mp(t, []any{
		1.0,
		[]any{
			map[string]any{"type": "BlockStored", "block_hashes": [][]byte{h1}, "parent_block_hash": parent,
				"token_ids": []uint32{7, 8}, "block_size": 2, "lora_id": nil, "medium": "GPU"},
			map[string]any{"type": "BlockRemoved", "block_hashes": [][]byte{h1}},
		},
	})
	b := decodeOK(t, payload)
	e := b.Events[0]
	if e.Hashes[0] != 0x0102030405060708 || !e.HasParent || e.Parent != 0x0102 {
		t.Fatalf("event 0: hashes %#x parent %#x", e.Hashes, e.Parent)
	}
	if b.Events[1].Hashes[0] != 0x0102030405060708 {
		t.Fatalf("removed: %#x", b.Events[1].Hashes)
	}
}

func TestDecodeIgnoreReasons(t *testing.T) {
	toks := []uint32{1, 2}
	tests := []struct {
		name  string
		event any
		want  Ignore
	}{
		{"sliding window map", map[string]any{"type": "BlockStored", "block_hashes": []uint64{1}, "token_ids": toks,
			"block_size": 2, "group_idx": 1, "kv_cache_spec_kind": "sliding_window"}, IgnoreKind},
		{"mamba array", arrStored([]uint64{1}, nil, toks, 2, nil, "GPU", nil, nil, 1, "mamba"), IgnoreKind},
		{"mla attention", arrStored([]uint64{1}, nil, toks, 2, nil, "GPU", nil, nil, 0, "mla_attention"), IgnoreNone},
		{"sink full attention", arrStored([]uint64{1}, nil, toks, 2, nil, nil, nil, nil, 0, "sink_full_attention"), IgnoreNone},
		{"kind nil", arrStored([]uint64{1}, nil, toks, 2, nil, nil, nil, nil, nil, nil), IgnoreNone},
		{"lora id", arrStored([]uint64{1}, nil, toks, 2, 3), IgnoreLoRA},
		{"lora id zero", arrStored([]uint64{1}, nil, toks, 2, 0), IgnoreNone},
		{"lora name", arrStored([]uint64{1}, nil, toks, 2, nil, "GPU", "my-adapter"), IgnoreLoRA},
		{"cpu medium", arrStored([]uint64{1}, nil, toks, 2, nil, "CPU"), IgnoreMedium},
		{"extra keys", arrStored([]uint64{1, 2}, nil, []uint32{1, 2, 3, 4}, 2, nil, "GPU", nil,
			[]any{nil, []any{"mm-hash", []any{0, 5}}}), IgnoreExtraKeys},
		{"extra keys all nil", arrStored([]uint64{1}, nil, toks, 2, nil, "GPU", nil, []any{nil}), IgnoreNone},
		{"removed on cpu", arrRemoved([]uint64{1}, "cpu"), IgnoreMedium},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := decodeOK(t, mp(t, []any{0, []any{tt.event}}))
			if got := b.Events[0].Ignore; got != tt.want {
				t.Fatalf("ignore = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDecodeIgnoredEventSkipsTokenValidation(t *testing.T) {
	// A mamba group's layout need not satisfy tokens == hashes×block_size.
	b := decodeOK(t, mp(t, []any{0, []any{arrStored([]uint64{1, 2}, nil, []uint32{1}, 560, nil, nil, nil, nil, 1, "mamba")}}))
	if b.Events[0].Ignore != IgnoreKind {
		t.Fatalf("%+v", b.Events[0])
	}
}

func TestDecodeBigramTokens(t *testing.T) {
	pairs := [][]uint32{{10, 11}, {11, 12}, {12, 13}, {13, 99}}
	b := decodeOK(t, mp(t, []any{0, []any{arrStored([]uint64{1, 2}, nil, pairs, 2)}}))
	if got := b.Events[0].Tokens; !slices.Equal(got, []uint32{10, 11, 12, 13}) {
		t.Fatalf("tokens %v", got)
	}
}

func TestDecodeTokenEncodings(t *testing.T) {
	// Every integer width msgpack allows for a token id, compact (as
	// msgspec writes) and fixed-width, plain and as bigram pairs mixed in.
	want := []uint32{0, 1, 127, 128, 255, 256, 65535, 65536, 151643, 0xFFFFFFFF, 7, 8}
	plain := []any{uint8(0), int64(1), uint16(127), uint32(128), uint64(255), int32(256), uint32(65535),
		int64(65536), uint64(151643), uint64(0xFFFFFFFF), int8(7), uint8(8)}
	mixed := slices.Clone(plain)
	mixed[3] = []any{uint32(128), 5}
	mixed[11] = []any{int64(8), int64(9)}
	for _, compact := range []bool{true, false} {
		for name, toks := range map[string][]any{"plain": plain, "with pairs": mixed} {
			payload := mpWith(t, []any{0, []any{arrStored([]uint64{1, 2, 3}, nil, toks, 4)}}, compact)
			b := decodeOK(t, payload)
			if got := b.Events[0].Tokens; !slices.Equal(got, want) {
				t.Fatalf("compact=%v %s: %v", compact, name, got)
			}
		}
	}
	// A token cut off mid-value is an error, not a short read.
	payload := mp(t, []any{0, []any{arrStored([]uint64{1}, nil, []uint32{70000}, 1)}})
	if err := NewDecoder().Decode(payload[:len(payload)-2], new(Batch)); !errors.Is(err, ErrBadEvent) {
		t.Fatalf("truncated token: %v", err)
	}
}

func TestDecodeUnknownEventType(t *testing.T) {
	b := decodeOK(t, mp(t, []any{0, []any{
		[]any{"BlockTouched", []uint64{1, 2}, map[string]any{"x": 1}},
		map[string]any{"type": "SomethingNew", "block_hashes": []uint64{5}},
		arrRemoved([]uint64{9}),
	}}))
	if b.Unknown != 2 || len(b.Events) != 1 || b.Events[0].Hashes[0] != 9 {
		t.Fatalf("unknown %d events %+v", b.Unknown, b.Events)
	}
}

func TestDecodeErrors(t *testing.T) {
	deep := []any{0}
	for range 100 {
		deep = []any{deep}
	}
	tests := []struct {
		name    string
		payload []byte
		want    string
	}{
		{"empty", nil, "EOF"},
		{"scalar batch", mp(t, 5), "neither an array nor a map"},
		{"short batch", mp(t, []any{1.0}), "want [ts, events"},
		{"ts string", mp(t, []any{"x", []any{}}), "ts"},
		{"events not array", mp(t, []any{1.0, 5}), "events is not an array"},
		{"map without events", mp(t, map[string]any{"ts": 1}), "no events"},
		{"event scalar", mp(t, []any{1.0, []any{7}}), "neither an array nor a map"},
		{"event empty array", mp(t, []any{1.0, []any{[]any{}}}), "empty event array"},
		{"tag not string", mp(t, []any{1.0, []any{[]any{1, 2}}}), "tag"},
		{"token count", mp(t, []any{1.0, []any{arrStored([]uint64{1, 2}, nil, []uint32{1, 2, 3}, 2)}}), "3 token ids for 2 blocks"},
		{"block size zero", mp(t, []any{1.0, []any{arrStored([]uint64{1}, nil, []uint32{}, 0)}}), "block_size"},
		{"block size huge", mp(t, []any{1.0, []any{arrStored([]uint64{1}, nil, []uint32{}, 1<<30)}}), "out of range"},
		{"float hash", mp(t, []any{1.0, []any{arrStored([]any{1.5}, nil, []uint32{1}, 1)}}), "block_hashes[0]"},
		{"nil hash", mp(t, []any{1.0, []any{arrStored([]any{nil}, nil, []uint32{1}, 1)}}), "block_hashes[0]"},
		{"empty bytes hash", mp(t, []any{1.0, []any{arrStored([]any{[]byte{}}, nil, []uint32{1}, 1)}}), "empty bytes hash"},
		{"negative token", mp(t, []any{1.0, []any{arrStored([]uint64{1}, nil, []int{-1}, 1)}}), "token id -1"},
		{"huge token", mp(t, []any{1.0, []any{arrStored([]uint64{1}, nil, []int64{1 << 40}, 1)}}), "out of range"},
		{"string token", mp(t, []any{1.0, []any{arrStored([]uint64{1}, nil, []any{"a"}, 1)}}), "token id"},
		{"empty token pair", mp(t, []any{1.0, []any{arrStored([]uint64{1}, nil, []any{[]any{}}, 1)}}), "empty token pair"},
		{"hashes not array", mp(t, []any{1.0, []any{arrRemoved(5)}}), "block_hashes is not an array"},
		{"negative dp rank", mp(t, []any{1.0, []any{}, -1}), "dp_rank"},
		{"negative group", mp(t, []any{1.0, []any{arrRemoved([]uint64{1}, nil, -2)}}), "group_idx"},
		{"extra keys scalar", mp(t, []any{1.0, []any{arrStored([]uint64{1}, nil, []uint32{1}, 1, nil, nil, nil, 7)}}), "extra_keys"},
		{"too deep", mp(t, []any{1.0, []any{[]any{"BlockStored", []uint64{}, nil, []uint32{}, 1, nil, nil, nil, nil, nil, nil, deep}}}), "nested too deeply"},
		{"trailing bytes", append(mp(t, []any{1.0, []any{}}), 0xc0), "trailing bytes"},
		{"truncated", mp(t, []any{1.0, []any{arrStored([]uint64{1, 2}, nil, []uint32{1, 2}, 1)}})[:12], "EOF"},
		{"duplicate events", []byte{0x82, 0xa6, 'e', 'v', 'e', 'n', 't', 's', 0x90, 0xa6, 'e', 'v', 'e', 'n', 't', 's', 0x90}, "duplicate"},
		{"huge declared array", []byte{0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff}, "EOF"},
		{"huge declared string", []byte{0x92, 0x00, 0x91, 0x92, 0xdb, 0x7f, 0xff, 0xff, 0xff}, "EOF"},
	}
	d := NewDecoder()
	var b Batch
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := d.Decode(tt.payload, &b)
			if !errors.Is(err, ErrBadEvent) {
				t.Fatalf("err = %v, want ErrBadEvent", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %q, want it to mention %q", err, tt.want)
			}
		})
	}
	// The decoder recovers for the next payload.
	if err := d.Decode(mp(t, []any{1.0, []any{arrRemoved([]uint64{1})}}), &b); err != nil || len(b.Events) != 1 {
		t.Fatalf("after errors: %v %+v", err, b.Events)
	}
}

func TestDecodeZeroAlloc(t *testing.T) {
	payload := mp(t, []any{1.0, []any{
		arrStored([]uint64{1, 2, 3, 4}, uint64(9), seqTokens(64, func(i int) uint32 { return uint32(i) }), 16, nil, "GPU", nil, nil, 0, "full_attention"),
		map[string]any{"type": "BlockRemoved", "block_hashes": []uint64{1, 2}, "medium": "GPU", "unknown": []any{1, "x"}},
		[]any{"AllBlocksCleared"},
	}, 0})
	d := NewDecoder()
	var b Batch
	if err := d.Decode(payload, &b); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if err := d.Decode(payload, &b); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocs per decode", allocs)
	}
}

func TestBatchResetDropsHugeArena(t *testing.T) {
	var b Batch
	b.tokens = make([]uint32, 0, maxRetainTokens+1)
	b.Reset()
	if cap(b.tokens) != 0 {
		t.Fatalf("arena kept: %d", cap(b.tokens))
	}
}

func FuzzDecode(f *testing.F) {
	seeds := []any{
		[]any{1.0, []any{arrStored([]uint64{1, 2}, nil, []uint32{1, 2, 3, 4}, 2, nil, "GPU", nil, []any{nil, nil}, 0, "full_attention"), arrRemoved([]uint64{1}, "GPU", 0), []any{"AllBlocksCleared"}}, 0},
		[]any{int64(2), []any{arrStored([]int64{-1}, int64(-2), [][]uint32{{1, 2}, {2, 3}}, 2)}},
		map[string]any{"ts": 1.5, "events": []any{map[string]any{"type": "BlockStored", "block_hashes": [][]byte{{1, 2, 3, 4, 5, 6, 7, 8, 9}}, "parent_block_hash": []byte{1}, "token_ids": []uint32{5}, "block_size": 1, "x": map[string]any{"y": nil}}}, "dp_rank": 3},
	}
	for _, s := range seeds {
		f.Add(mp(f, s))
	}
	f.Add([]byte{0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff})
	d := NewDecoder()
	var b Batch
	f.Fuzz(func(t *testing.T, payload []byte) {
		if err := d.Decode(payload, &b); err != nil {
			if !errors.Is(err, ErrBadEvent) {
				t.Fatalf("error does not wrap ErrBadEvent: %v", err)
			}
			return
		}
		for _, e := range b.Events {
			if e.Type == EventBlockStored && e.Ignore == IgnoreNone && len(e.Hashes) > 0 &&
				(e.BlockSize <= 0 || len(e.Tokens) != len(e.Hashes)*e.BlockSize) {
				t.Fatalf("accepted inconsistent event %+v", e)
			}
		}
		// Whatever decodes must apply without panicking.
		idx := NewIndex(IndexConfig{MaxBlocks: 64})
		w, _ := idx.Register(Key{Worker: "w"}, 0)
		idx.Apply(w, &b)
	})
}
