package transport

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestDescText(t *testing.T) {
	d := Desc{Peer: "10.0.0.7:17001", Name: "req-42/kv", Addr: 0x7f0000001000, Len: 1 << 20, ID: 3, Device: -1}
	b, err := json.Marshal(map[string]Desc{"kv": d})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"kv":"ifx1|10.0.0.7:17001|req-42/kv|139637976731648|1048576|3|-1"}`; string(b) != want {
		t.Fatalf("got %s, want %s", b, want)
	}
	var back map[string]Desc
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back["kv"] != d {
		t.Fatalf("round trip: %+v, want %+v", back["kv"], d)
	}
	for _, bad := range []string{
		"", "ifx1|", "ifx1|p|n|1|2|3", "ifx1|p|n|1|2|3|-1|x", "ifx2|p|n|1|2|3|-1",
		"ifx1||n|1|2|3|-1", "ifx1|p||1|2|3|-1", "ifx1|p|n|x|2|3|-1", "ifx1|p|n|1|2|3|-2",
		"ifx1|p|n|1|1099511627777|3|-1", "ifx1|p|n|1|2|4294967296|-1", "ifx1|p\x01|n|1|2|3|-1",
	} {
		var d Desc
		if err := d.UnmarshalText([]byte(bad)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := (Desc{Peer: "a|b", Name: "n"}).MarshalText(); !errors.Is(err, ErrInvalid) {
		t.Errorf("peer with separator: %v", err)
	}
}

func FuzzDescText(f *testing.F) {
	f.Add([]byte("ifx1|10.0.0.7:17001|req-42/kv|139637976731648|1048576|3|-1"))
	f.Add([]byte("ifx1|p|n|0|0|0|0"))
	f.Add([]byte("ifx1|p|n|1|2|3"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var d Desc
		if d.UnmarshalText(b) != nil {
			return
		}
		enc, err := d.MarshalText()
		if err != nil {
			t.Fatalf("accepted %q but cannot encode %+v: %v", b, d, err)
		}
		var again Desc
		if err := again.UnmarshalText(enc); err != nil || again != d {
			t.Fatalf("round trip of %q: %+v, %v; want %+v", enc, again, err, d)
		}
	})
}
