package kvnats_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"slices"
	"testing"

	"github.com/infera/infera/kvnats"
	"github.com/infera/infera/natsx"
)

// TestNamesGolden: the token, subject and key the reference writes.
func TestNamesGolden(t *testing.T) {
	if got := natsx.Token("10.0.0.1:8080"); got != "MTAuMC4wLjE6ODA4MA" {
		t.Fatalf("token %q", got)
	}
	if got := kvnats.Subject("10.0.0.1:8080", 3); got != "infera.kv.events.MTAuMC4wLjE6ODA4MA.3" {
		t.Fatalf("subject %q", got)
	}
	if got := kvnats.ViewKey("10.0.0.1:8080", 0); got != "MTAuMC4wLjE6ODA4MA.0" {
		t.Fatalf("key %q", got)
	}
	w, r, err := kvnats.ParseSubject("infera.kv.events.MTAuMC4wLjE6ODA4MA.3")
	if err != nil || w != "10.0.0.1:8080" || r != 3 {
		t.Fatalf("parse: %q %d %v", w, r, err)
	}
	// Python's decoder pads; a padded token names the same worker.
	if w, _, err := kvnats.ParseViewKey("MTAuMC4wLjE6ODA4MA==.0"); err != nil || w != "10.0.0.1:8080" {
		t.Fatalf("padded: %q %v", w, err)
	}
}

func TestParseSubjectRejects(t *testing.T) {
	for _, s := range []string{
		"", "infera.kv.events", "infera.kv.events.", "infera.kv.events.MTAuMC4wLjE6ODA4MA",
		"infera.kv.events.MTAuMC4wLjE6ODA4MA.", "infera.kv.events.MTAuMC4wLjE6ODA4MA.-1",
		"infera.kv.events.MTAuMC4wLjE6ODA4MA.01", "infera.kv.events.MTAuMC4wLjE6ODA4MA.x",
		"infera.kv.events.a.b.0", "infera.kv.events.!!.0", "infera.kv.events..0",
		"infera.req.MTAuMC4wLjE6ODA4MA.0", "infera.kv.events._w.0", // "_w" decodes to a non-UTF-8 byte
		"infera.kv.events.MTAuMC4wLjE6ODA4MA.99999999999999999999",
	} {
		if w, r, err := kvnats.ParseSubject(s); !errors.Is(err, kvnats.ErrBadSubject) {
			t.Errorf("%q: %q %d %v, want ErrBadSubject", s, w, r, err)
		}
	}
}

// TestViewGolden: the bucket value is a msgpack array of the sorted hashes,
// each in its shortest unsigned form, as msgspec encodes a list of ints.
func TestViewGolden(t *testing.T) {
	hashes := []uint64{1 << 63, 70000, 1, 200, 1 << 40}
	got := kvnats.AppendView(nil, hashes)
	want, _ := hex.DecodeString("95" + "01" + "ccc8" + "ce00011170" + "cf0000010000000000" + "cf8000000000000000")
	if !bytes.Equal(got, want) {
		t.Fatalf("view %x, want %x", got, want)
	}
	back, err := kvnats.ParseView(nil, got)
	if err != nil || !slices.Equal(back, []uint64{1, 200, 70000, 1 << 40, 1 << 63}) {
		t.Fatalf("parse %v %v", back, err)
	}
	// Negative ints (a signed encoder) keep their two's complement.
	if back, err := kvnats.ParseView(nil, []byte{0x91, 0xff}); err != nil || back[0] != ^uint64(0) {
		t.Fatalf("negative: %v %v", back, err)
	}
	for _, bad := range [][]byte{nil, {0x91}, {0x91, 0xa1, 'x'}, {0x90, 0x00}, {0xdd, 0xff, 0xff, 0xff, 0xff}} {
		if _, err := kvnats.ParseView(nil, bad); !errors.Is(err, kvnats.ErrBadView) {
			t.Errorf("%x: %v, want ErrBadView", bad, err)
		}
	}
}

func FuzzParseSubject(f *testing.F) {
	f.Add("infera.kv.events.MTAuMC4wLjE6ODA4MA.3")
	f.Add("infera.kv.events.MTAuMC4wLjE6ODA4MA==.0")
	f.Add("infera.kv.events.a.b.0")
	f.Fuzz(func(t *testing.T, s string) {
		w, r, err := kvnats.ParseSubject(s)
		if err != nil {
			if !errors.Is(err, kvnats.ErrBadSubject) {
				t.Fatalf("%q: unwrapped error %v", s, err)
			}
			return
		}
		if w == "" || r < 0 {
			t.Fatalf("%q: %q %d", s, w, r)
		}
		// What parses names a subject that parses back to the same.
		w2, r2, err := kvnats.ParseSubject(kvnats.Subject(w, r))
		if err != nil || w2 != w || r2 != r {
			t.Fatalf("%q: round trip %q %d %v", s, w2, r2, err)
		}
	})
}

func FuzzParseView(f *testing.F) {
	f.Add(kvnats.AppendView(nil, []uint64{1, 2, 1 << 63}))
	f.Add([]byte{0x90})
	f.Fuzz(func(t *testing.T, b []byte) {
		hs, err := kvnats.ParseView(nil, b)
		if err != nil {
			if !errors.Is(err, kvnats.ErrBadView) {
				t.Fatalf("unwrapped error %v", err)
			}
			return
		}
		back, err := kvnats.ParseView(nil, kvnats.AppendView(nil, slices.Clone(hs)))
		slices.Sort(hs)
		if err != nil || !slices.Equal(back, hs) {
			t.Fatalf("round trip %v → %v %v", hs, back, err)
		}
	})
}
