package router_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/infera/infera/router"
)

func TestMessagesUnaryThroughSim(t *testing.T) {
	u := startSim(t, nil)
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), simRecord(u))
	resp, body := tr.do(t, "POST", "/v1/messages",
		`{"model":"sim-model","max_tokens":5,"system":"be brief","messages":[{"role":"user","content":"hello"}]}`,
		"anthropic-version", "2023-06-01")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var m struct {
		ID, Type, Role, Model string
		StopReason            string `json:"stop_reason"`
		Content               []struct{ Type, Text string }
		Usage                 struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
		}
	}
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	if !strings.HasPrefix(m.ID, "msg_") || m.Type != "message" || m.Role != "assistant" || m.StopReason != "max_tokens" ||
		len(m.Content) != 1 || m.Content[0].Type != "text" || m.Content[0].Text == "" || m.Usage.OutputTokens != 5 || m.Usage.InputTokens == 0 {
		t.Fatalf("message %s", body)
	}
}

func TestMessagesStreamThroughSim(t *testing.T) {
	u := startSim(t, nil)
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), simRecord(u))
	resp, b := tr.do(t, "POST", "/v1/messages", `{"model":"sim-model","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hello"}]}`)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("%d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	// Every event's name matches its data's type; the sequence is
	// Anthropic's, with one text block of four deltas (max_tokens 4).
	var names []string
	var text strings.Builder
	var delta struct {
		Delta struct {
			StopReason string `json:"stop_reason"`
		}
		Usage struct {
			OutputTokens int `json:"output_tokens"`
		}
	}
	for _, ev := range strings.Split(strings.TrimSpace(string(b)), "\n\n") {
		if strings.HasPrefix(ev, ":") {
			continue // a heartbeat comment on a slow machine
		}
		name, data, ok := strings.Cut(ev, "\ndata: ")
		name = strings.TrimPrefix(name, "event: ")
		var d struct {
			Type  string
			Delta struct{ Type, Text string }
		}
		if !ok || json.Unmarshal([]byte(data), &d) != nil || d.Type != name {
			t.Fatalf("malformed event %q in:\n%s", ev, b)
		}
		names = append(names, name)
		switch name {
		case "content_block_delta":
			if d.Delta.Type != "text_delta" {
				t.Fatalf("delta of type %q", d.Delta.Type)
			}
			text.WriteString(d.Delta.Text)
		case "message_delta":
			if err := json.Unmarshal([]byte(data), &delta); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := []string{"message_start", "ping", "content_block_start",
		"content_block_delta", "content_block_delta", "content_block_delta", "content_block_delta",
		"content_block_stop", "message_delta", "message_stop"}
	if !slices.Equal(names, want) {
		t.Fatalf("events %v, want %v", names, want)
	}
	if text.Len() == 0 || delta.Delta.StopReason != "max_tokens" || delta.Usage.OutputTokens != 4 {
		t.Fatalf("text %q, stop_reason %q, output_tokens %d", text.String(), delta.Delta.StopReason, delta.Usage.OutputTokens)
	}
}

func TestMessagesErrors(t *testing.T) {
	u := startSim(t, nil)
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), simRecord(u))
	for _, tc := range []struct {
		body   string
		status int
		typ    string
	}{
		{`{"model":"nope","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, 404, "not_found_error"},
		{`{"model":"sim-model","messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request_error"},
		{`{"model":"sim-model","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`, 400, "invalid_request_error"},
		{`{`, 400, "invalid_request_error"},
	} {
		resp, body := tr.do(t, "POST", "/v1/messages", tc.body)
		var e struct {
			Type  string
			Error struct{ Type, Message string }
		}
		if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != tc.status || e.Type != "error" || e.Error.Type != tc.typ || e.Error.Message == "" {
			t.Errorf("%s: %d %s", tc.body, resp.StatusCode, body)
		}
	}
	_ = http.StatusOK
}

// TestMessagesToolRoundTripThroughSim: a tool_use answer (unary and
// streamed) from the simulator's tool call, then the tool_result turn
// answered in text.
func TestMessagesToolRoundTripThroughSim(t *testing.T) {
	u := startSim(t, nil)
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), simRecord(u))
	tools := `"tools":[{"name":"lookup","description":"d","input_schema":{"type":"object","properties":{"input":{"type":"string"}}}}]`
	resp, body := tr.do(t, "POST", "/v1/messages", `{"model":"sim-model","max_tokens":6,`+tools+`,"messages":[{"role":"user","content":"please call_tool now"}]}`)
	var m struct {
		StopReason string `json:"stop_reason"`
		Content    []struct {
			Type, ID, Name string
			Input          map[string]any
		}
	}
	if err := json.Unmarshal(body, &m); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if m.StopReason != "tool_use" || len(m.Content) != 1 || m.Content[0].Type != "tool_use" || m.Content[0].Name != "lookup" || m.Content[0].Input["input"] != "sim" || m.Content[0].ID == "" {
		t.Fatalf("tool_use answer %s", body)
	}
	_, body = tr.do(t, "POST", "/v1/messages", `{"model":"sim-model","max_tokens":6,"stream":true,`+tools+`,"messages":[{"role":"user","content":"please call_tool now"}]}`)
	for _, want := range []string{`"content_block":{"type":"tool_use","id":"chatcmpl-tool-`, `"name":"lookup","input":{}}`, `"type":"input_json_delta","partial_json":`, `"stop_reason":"tool_use"`} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("stream lacks %s:\n%s", want, body)
		}
	}
	next := `{"model":"sim-model","max_tokens":3,` + tools + `,"messages":[{"role":"user","content":"please call_tool now"},` +
		`{"role":"assistant","content":[{"type":"tool_use","id":"` + m.Content[0].ID + `","name":"lookup","input":{"input":"sim"}}]},` +
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"` + m.Content[0].ID + `","content":"42"}]}]}`
	resp, body = tr.do(t, "POST", "/v1/messages", next)
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"content":[{"type":"text"`) || !strings.Contains(string(body), `"stop_reason":"max_tokens"`) {
		t.Fatalf("final answer %d %s", resp.StatusCode, body)
	}
}
