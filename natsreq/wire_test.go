package natsreq_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/infera/infera/natsreq"
)

// TestEnvelopeGolden: the envelope as the reference's json.dumps writes it.
func TestEnvelopeGolden(t *testing.T) {
	for _, c := range []struct {
		env  natsreq.Envelope
		want string
	}{
		{natsreq.Envelope{Path: "/v1/chat/completions", Stream: true, Headers: map[string]string{"X-Data-Parallel-Rank": "1", "Accept": "text/event-stream"},
			Body: json.RawMessage(`{"model": "m", "stream": true}`), Migratable: true},
			`{"path": "/v1/chat/completions", "stream": true, "headers": {"Accept": "text/event-stream", "X-Data-Parallel-Rank": "1"}, "body": {"model": "m", "stream": true}, "migratable": true}`},
		{natsreq.Envelope{Path: "/v1/completions", Body: json.RawMessage(`{"prompt":"x"}`)},
			`{"path": "/v1/completions", "stream": false, "headers": null, "body": {"prompt":"x"}, "migratable": false}`},
		{natsreq.Envelope{Path: "/v1/é", Headers: map[string]string{"X-N": "a\"b\\c\n😀\x01\x7f"}},
			`{"path": "/v1/\u00e9", "stream": false, "headers": {"X-N": "a\"b\\c\n\ud83d\ude00\u0001` + "\x7f" + `"}, "body": {}, "migratable": false}`},
	} {
		got := string(c.env.AppendJSON(nil))
		if got != c.want {
			t.Errorf("envelope\n got %s\nwant %s", got, c.want)
		}
		back, err := natsreq.ParseEnvelope([]byte(got))
		if c.env.Path == "/v1/é" {
			if !errors.Is(err, natsreq.ErrBadEnvelope) {
				t.Errorf("a non-ASCII path and a header with a newline parsed: %v", err)
			}
			continue
		}
		if err != nil || back.Path != c.env.Path || back.Stream != c.env.Stream || back.Migratable != c.env.Migratable {
			t.Errorf("parse back %q: %+v %v", got, back, err)
		}
	}
}

func TestParseEnvelopeRejects(t *testing.T) {
	for _, s := range []string{
		``, `[]`, `{"path": "http://evil/x"}`, `{"path": "//evil/x"}`, `{"path": "/v1/../admin"}`,
		`{"path": "/v1/x y"}`, `{"body": [1]}`, `{"body": "x"}`, `{"headers": {"X": 1}}`,
		`{"headers": {"X\r\nY": "1"}}`, `{"headers": {"X": "a\r\nb"}}`, `{} {}`,
	} {
		if _, err := natsreq.ParseEnvelope([]byte(s)); !errors.Is(err, natsreq.ErrBadEnvelope) {
			t.Errorf("%q: %v, want ErrBadEnvelope", s, err)
		}
	}
	e, err := natsreq.ParseEnvelope([]byte(`{"stream": true}`))
	if err != nil || e.Path != "/v1/chat/completions" || string(e.Body) != "{}" {
		t.Fatalf("defaults: %+v %v", e, err)
	}
}

// TestFrames: the reply headers as the reference writes and reads them.
func TestFrames(t *testing.T) {
	for _, c := range []struct {
		h      nats.Header
		typ    string
		status int
		bad    bool
	}{
		{nil, natsreq.TypeData, 0, false},
		{nats.Header{"rs-type": {"data"}}, natsreq.TypeData, 0, false},
		{nats.Header{"rs-type": {"done"}, "rs-status": {"429"}}, natsreq.TypeDone, 429, false},
		{nats.Header{"rs-type": {"done"}}, natsreq.TypeDone, 200, false},
		{nats.Header{"rs-type": {"error"}}, natsreq.TypeError, 0, false},
		{nats.Header{"rs-type": {"done"}, "rs-status": {"x"}}, "", 0, true},
		{nats.Header{"rs-type": {"other"}}, "", 0, true},
	} {
		f, err := natsreq.ParseFrame(c.h, nil)
		if c.bad {
			if !errors.Is(err, natsreq.ErrTransport) {
				t.Errorf("%v: %v, want ErrTransport", c.h, err)
			}
			continue
		}
		if err != nil || f.Type != c.typ || f.Status != c.status {
			t.Errorf("%v: %+v %v", c.h, f, err)
		}
	}
	if natsreq.Subject("10.0.0.1:8080") != "infera.req.MTAuMC4wLjE6ODA4MA" ||
		natsreq.CancelSubject("10.0.0.1:8080") != "infera.cancel.MTAuMC4wLjE6ODA4MA" ||
		natsreq.Durable("10.0.0.1:8080") != "MTAuMC4wLjE6ODA4MA" {
		t.Fatal("subjects")
	}
}

func FuzzParseEnvelope(f *testing.F) {
	f.Add([]byte(`{"path": "/v1/chat/completions", "stream": true, "headers": null, "body": {"a": 1}, "migratable": false}`))
	f.Add([]byte(`{"path": "/v1/../x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := natsreq.ParseEnvelope(b)
		if err != nil {
			if !errors.Is(err, natsreq.ErrBadEnvelope) {
				t.Fatalf("unwrapped %v", err)
			}
			return
		}
		// What parses re-encodes to an envelope that parses the same.
		back, err := natsreq.ParseEnvelope(e.AppendJSON(nil))
		if err != nil || back.Path != e.Path || back.Stream != e.Stream || back.Migratable != e.Migratable || len(back.Headers) != len(e.Headers) {
			t.Fatalf("round trip %+v → %+v %v", e, back, err)
		}
	})
}

func TestBacklogBodies(t *testing.T) {
	if got := string(natsreq.AppendBacklogBody(nil, "10.0.0.1:8080")); got != `{"error":"worker 10.0.0.1:8080 request backlog over limit"}` {
		t.Fatal(got)
	}
	var v map[string]string
	if err := json.Unmarshal(natsreq.AppendBacklogBody(nil, `a"b`), &v); err != nil || v["error"] != `worker a"b request backlog over limit` {
		t.Fatal(v, err)
	}
	if err := json.Unmarshal([]byte(natsreq.PDBacklogBody), &v); err != nil {
		t.Fatal(err)
	}
}

// FuzzParseFrame: a reply frame from a worker (outside input) is data,
// done with a status from 100 to 999, or error, else ErrTransport; its
// payload is passed on as it came.
func FuzzParseFrame(f *testing.F) {
	f.Add("", "", []byte("data: {}\n\n"))
	f.Add("done", "200", []byte(nil))
	f.Add("done", "", []byte(nil))
	f.Add("done", "99", []byte(nil))
	f.Add("error", "", []byte("infera: worker draining"))
	f.Add("bogus", "1e3", []byte("x"))
	f.Fuzz(func(t *testing.T, typ, status string, data []byte) {
		h := nats.Header{}
		if typ != "" {
			h.Set(natsreq.HeaderType, typ)
		}
		if status != "" {
			h.Set(natsreq.HeaderStatus, status)
		}
		fr, err := natsreq.ParseFrame(h, data)
		if err != nil {
			if !errors.Is(err, natsreq.ErrTransport) {
				t.Fatalf("unwrapped %v", err)
			}
			return
		}
		switch fr.Type {
		case natsreq.TypeData, natsreq.TypeError:
		case natsreq.TypeDone:
			if fr.Status < 100 || fr.Status > 999 {
				t.Fatalf("done with status %d", fr.Status)
			}
		default:
			t.Fatalf("frame type %q", fr.Type)
		}
		if string(fr.Data) != string(data) {
			t.Fatalf("payload changed")
		}
	})
}
