package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/infera/infera/internal/testkit"
)

// TestAuth (issue 5, acceptance 5): API keys guard the OpenAI endpoints
// (401 invalid_api_key in the OpenAI envelope without a valid key), /health
// stays open, and the admin endpoints live only on --admin-listen, behind
// --admin-token. Keys come from --api-keys-file or INFERA_API_KEYS.
func TestAuth(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte("# clients\nkey-one\n\n  key-two  \n# key-three\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const adminToken = "admin-secret"
	adminAddr := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	admin := "http://" + adminAddr
	f := startServe(t, "--log-level", "info", "--router-policy", "kv-aware",
		"--api-keys-file", keys, "--admin-listen", adminAddr, "--admin-token", adminToken)
	_, id := f.startWorker("worker", "--time-scale", "0")
	bearer := func(token string) map[string]string { return map[string]string{"Authorization": "Bearer " + token} }
	waitAdminWorker(t, admin, bearer(adminToken), id)

	chatURL := f.base + "/v1/chat/completions"
	t.Run("api keys", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			headers map[string]string
		}{
			{"no key", nil},
			{"wrong key", bearer("key-three")},
			{"key prefix", bearer("key-on")},
			{"empty bearer", map[string]string{"Authorization": "Bearer "}},
			{"not bearer", map[string]string{"Authorization": "Basic key-one"}},
			{"bare key", map[string]string{"Authorization": "key-one"}},
			{"admin token", bearer(adminToken)},
		} {
			for _, url := range []string{chatURL, f.base + "/v1/completions"} {
				res, err := do(t.Context(), http.MethodPost, url, chatBody(false, "hi", 2), tc.headers)
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				if err := checkEnvelope(res, http.StatusUnauthorized, "invalid_api_key"); err != nil {
					t.Errorf("%s on %s: %v", tc.name, url, err)
				}
			}
			res, err := do(t.Context(), http.MethodGet, f.base+"/v1/models", nil, tc.headers)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if err := checkEnvelope(res, http.StatusUnauthorized, "invalid_api_key"); err != nil {
				t.Errorf("%s on /v1/models: %v", tc.name, err)
			}
		}
		for i, key := range []string{"key-one", "key-two"} {
			res, err := do(t.Context(), http.MethodPost, chatURL, chatBody(i == 1, "hello", 4), bearer(key))
			if err != nil || res.status != http.StatusOK {
				t.Errorf("%s: status %d err %v body %s", key, res.status, err, clipBody(res.body))
			}
			res, err = do(t.Context(), http.MethodGet, f.base+"/v1/models", nil, bearer(key))
			if err != nil || res.status != http.StatusOK {
				t.Errorf("%s on /v1/models: status %d err %v", key, res.status, err)
			}
		}
		res, err := do(t.Context(), http.MethodGet, f.base+"/health", nil, nil)
		if err != nil || res.status != http.StatusOK {
			t.Errorf("/health without a key: status %d err %v", res.status, err)
		}
	})

	adminPaths := []string{"/v1/workers", "/metrics", "/v1/admin/cache-view/" + id}
	t.Run("admin off the main address", func(t *testing.T) {
		for _, path := range append(adminPaths, "/v1/admin/cache-view/x") {
			for _, h := range []map[string]string{nil, bearer("key-one"), bearer(adminToken)} {
				res, err := do(t.Context(), http.MethodGet, f.base+path, nil, h)
				if err != nil {
					t.Fatal(err)
				}
				if res.status != http.StatusNotFound {
					t.Errorf("GET %s on the main address with %v: status %d, want 404; body %s", path, h, res.status, clipBody(res.body))
				}
			}
		}
	})

	t.Run("admin token", func(t *testing.T) {
		for _, path := range append(adminPaths, "/v1/admin/cache-view/x") {
			for _, h := range []map[string]string{nil, bearer("key-one"), bearer(adminToken + "x"), {"Authorization": adminToken}} {
				res, err := do(t.Context(), http.MethodGet, admin+path, nil, h)
				if err != nil {
					t.Fatal(err)
				}
				if err := checkEnvelope(res, http.StatusUnauthorized, ""); err != nil {
					t.Errorf("GET %s on the admin address with %v: %v", path, h, err)
				}
			}
		}
		for _, path := range adminPaths {
			res, err := do(t.Context(), http.MethodGet, admin+path, nil, bearer(adminToken))
			if err != nil || res.status != http.StatusOK {
				t.Errorf("GET %s with the admin token: status %d err %v body %s", path, res.status, err, clipBody(res.body))
			}
		}
		res, err := do(t.Context(), http.MethodGet, admin+"/v1/admin/cache-view/x", nil, bearer(adminToken))
		if err != nil || res.status != http.StatusNotFound {
			t.Errorf("cache view of an unknown worker with the admin token: status %d err %v, want 404", res.status, err)
		}
	})

	t.Run("INFERA_API_KEYS and admin token on the main address", func(t *testing.T) {
		// A second router on the first one's etcd: keys from the environment,
		// admin endpoints on the main address behind the token.
		env := append(cleanEnv(), "INFERA_API_KEYS=env-key-1,env-key-2")
		p := startEnv(t, "serve-env", env, "serve", "--listen", "127.0.0.1:0", "--log-level", "info",
			"--etcd-endpoints", f.etcd, "--admin-token", adminToken)
		addr, _ := p.waitLog("infera serve listening", 60*time.Second)["addr"].(string)
		base := "http://" + addr
		waitAdminWorker(t, base, bearer(adminToken), id)

		for _, h := range []map[string]string{nil, bearer("key-one"), bearer("env-key-1,env-key-2")} {
			res, err := do(t.Context(), http.MethodPost, base+"/v1/chat/completions", chatBody(false, "hi", 2), h)
			if err != nil {
				t.Fatal(err)
			}
			if err := checkEnvelope(res, http.StatusUnauthorized, "invalid_api_key"); err != nil {
				t.Errorf("chat with %v: %v", h, err)
			}
		}
		for _, key := range []string{"env-key-1", "env-key-2"} {
			res, err := do(t.Context(), http.MethodPost, base+"/v1/chat/completions", chatBody(false, "hi", 2), bearer(key))
			if err != nil || res.status != http.StatusOK {
				t.Errorf("chat with %s: status %d err %v body %s", key, res.status, err, clipBody(res.body))
			}
		}
		for _, path := range []string{"/v1/workers", "/metrics"} {
			for _, h := range []map[string]string{nil, bearer("env-key-1")} {
				res, err := do(t.Context(), http.MethodGet, base+path, nil, h)
				if err != nil {
					t.Fatal(err)
				}
				if err := checkEnvelope(res, http.StatusUnauthorized, ""); err != nil {
					t.Errorf("GET %s with %v: %v", path, h, err)
				}
			}
		}
		res, err := do(t.Context(), http.MethodGet, base+"/health", nil, nil)
		if err != nil || res.status != http.StatusOK {
			t.Errorf("/health without a key: status %d err %v", res.status, err)
		}
	})
}

// waitAdminWorker polls GET /v1/workers at base with headers until the
// worker is listed active.
func waitAdminWorker(t *testing.T, base string, headers map[string]string, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		res, err := do(t.Context(), http.MethodGet, base+"/v1/workers", nil, headers)
		if err == nil && res.status == http.StatusOK {
			records, derr := decodeWorkers(res.body)
			for _, r := range records {
				if r.WorkerID == id && (r.Status == "" || r.Status == "active") {
					return
				}
			}
			last = fmt.Sprintf("%v %s", derr, clipBody(res.body))
		} else {
			last = fmt.Sprintf("status %d err %v body %s", res.status, err, clipBody(res.body))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("worker %s not listed on %s/v1/workers: %s", id, base, last)
}
