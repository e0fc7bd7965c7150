package discovery_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/rs/zerolog"

	"github.com/infera/infera/discovery"
	"github.com/infera/infera/discovery/etcdtest"
)

// gatewayPost sends one JSON request to etcd's gRPC gateway over plain HTTP,
// as Infera's Python workers and servers do, and decodes the answer.
func gatewayPost(t *testing.T, endpoint, path string, req any, resp any) {
	t.Helper()
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	r, err := http.Post(endpoint+path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer func() { _ = r.Body.Close() }()
	b, _ := io.ReadAll(r.Body)
	if r.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: status %d: %s", path, r.StatusCode, b)
	}
	if err := json.Unmarshal(b, resp); err != nil {
		t.Fatalf("POST %s: %v in %s", path, err, b)
	}
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// A worker that registers through the JSON gateway (lease grant, put with
// the lease, range), exactly the calls Infera's Python RegistrationClient
// makes, works against the embedded etcd and is seen by a watcher.
func TestEmbeddedServesJSONGateway(t *testing.T) {
	eps := etcdtest.Start(t)
	ep := eps[0]

	var grant struct {
		ID  string `json:"ID"`
		TTL string `json:"TTL"`
	}
	gatewayPost(t, ep, "/v3/lease/grant", map[string]any{"TTL": 30}, &grant)
	if grant.ID == "" || grant.TTL != "30" {
		t.Fatalf("lease grant = %+v", grant)
	}

	const id = "127.0.0.1:28106"
	value := `{"worker_id":"` + id + `","url":"http://` + id + `","model_name":"m","engine":"vllm",` +
		`"disagg_mode":"mixed","disagg_meta":{},"kv_events_endpoint":null,"kv_block_size":null,` +
		`"dp_rank":null,"dp_size":null,"request_transport":"http"}`
	var put struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	gatewayPost(t, ep, "/v3/kv/put", map[string]any{"key": b64(testPrefix + id), "value": b64(value), "lease": grant.ID}, &put)
	if put.Header.Revision == "" {
		t.Fatalf("put answered no revision")
	}

	var rng struct {
		KVs []struct {
			Key   string `json:"key"`
			Value string `json:"value"`
			Lease string `json:"lease"`
		} `json:"kvs"`
		Count string `json:"count"`
	}
	gatewayPost(t, ep, "/v3/kv/range", map[string]any{"key": b64(testPrefix), "range_end": b64("/infera-test/workers0")}, &rng)
	if rng.Count != "1" || len(rng.KVs) != 1 || rng.KVs[0].Key != b64(testPrefix+id) ||
		rng.KVs[0].Value != b64(value) || rng.KVs[0].Lease != grant.ID {
		t.Fatalf("range = %+v", rng)
	}

	cli := etcdtest.Client(t, eps)
	w := discovery.NewWatcher(cli, testPrefix, zerolog.Nop(), nil)
	startWatcher(t, w)
	waitIDs(t, w, id)
	rec, _ := w.Snapshot().Get(id)
	if rec.Engine != discovery.EngineVLLM || rec.DPSize != 1 || !rec.Active() {
		t.Fatalf("record = %+v", rec)
	}

	// Revoking the lease over the gateway removes the worker.
	var revoke map[string]any
	gatewayPost(t, ep, "/v3/lease/revoke", map[string]any{"ID": grant.ID}, &revoke)
	waitIDs(t, w)
}
