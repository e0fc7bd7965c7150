package router_test

import (
	"encoding/json"
	"net/http"
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
	t.Logf("%d %s", resp.StatusCode, b)
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
