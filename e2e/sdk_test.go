package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sdkDir installs (scripts/install-sdks.sh, idempotent) the pinned
// official Node SDKs and returns their node_modules directory.
func sdkDir(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(root, ".run", "sdk")
	if d := os.Getenv("INFERA_SDK_DIR"); d != "" {
		dest = d
	}
	install := exec.Command("bash", filepath.Join(root, "scripts", "install-sdks.sh"), dest)
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("installing the Node SDKs (make sdks): %v\n%s", err, out)
	}
	return filepath.Join(dest, "node_modules")
}

// TestSDKClients (issue 13, acceptance 1): the official OpenAI and
// Anthropic Node SDKs against infera serve with a simulated worker: unary
// and streamed chat and messages, completions (text and token ids), tool
// call round trips, stop sequences (Anthropic stop_sequence), n=2 choices
// (unary, streamed, completions), models.retrieve,
// embeddings, usage with cached tokens, count_tokens, and errors as
// the SDKs' typed errors (unknown model 404, bad request 400, auth 401).
func TestSDKClients(t *testing.T) {
	modules := sdkDir(t)
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte("sdk-key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := startServe(t, "--log-level", "info", "--api-keys-file", keys)
	f.startWorker("worker", "--time-scale", "0")
	waitModelServed(t, f.base, "sdk-key")

	checks := map[string]string{
		"openai":    "chat,chat_stream_usage,completions,tools_round_trip,stop,n_choices,models_retrieve,embeddings,errors",
		"anthropic": "messages,messages_stream_cached,tool_round_trip,stop_sequences,count_tokens,errors",
	}
	for _, sdk := range []string{"openai", "anthropic"} {
		t.Run(sdk, func(t *testing.T) { runSDK(t, modules, sdk, f.base, "sdk-key", checks[sdk]) })
	}
}

// runSDK runs the named checks (comma-separated) of the SDK's script
// (e2e/sdk/<sdk>.cjs) against base, with env added to the environment;
// each check reports one JSON line, and every one must pass.
func runSDK(t *testing.T, modules, sdk, base, key, checks string, env ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Join("sdk", sdk+".cjs"), base, key, "sim-model")
	cmd.Env = append(append(os.Environ(), "NODE_PATH="+modules, "SDK_ONLY="+checks), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	ran := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r struct {
			Check string
			OK    bool
			Error string
		}
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			t.Logf("node: %s", sc.Text())
			continue
		}
		ran++
		if !r.OK {
			t.Errorf("%s %s: %s", sdk, r.Check, r.Error)
		}
	}
	if want := len(strings.Split(checks, ",")); ran != want {
		t.Errorf("%s: %d checks reported, want %d (exit %v)\nstdout %s\nstderr %s", sdk, ran, want, err, out, stderr.Bytes())
	} else if err != nil && !t.Failed() {
		t.Errorf("%s: node: %v\n%s", sdk, err, stderr.Bytes())
	}
}

// TestSDKStreamContinued (issue 30, acceptance 3): the official OpenAI and
// Anthropic SDKs stream through continuations without noticing. Two of
// three workers' engines "crash" a few tokens into the first stream they
// serve (--die-after-tokens); each broken stream is continued on another
// worker, and every stream the SDKs read carries the text of an unbroken
// run, one finish, no error.
func TestSDKStreamContinued(t *testing.T) {
	modules := sdkDir(t)
	const prompt, maxTokens = "tell the sdk a long story", 60
	for _, sdk := range []string{"openai", "anthropic"} {
		t.Run(sdk, func(t *testing.T) {
			f := startServe(t, "--log-level", "info", "--migration-limit", "3")
			f.startWorker("worker-dies-a", "--time-scale", "0", "--die-after-tokens", "9")
			f.startWorker("worker-dies-b", "--time-scale", "0", "--die-after-tokens", "17")
			_, _, healthyURL := f.startWorkerURL("worker-healthy", "--time-scale", "0")
			f.waitWorkers("three active workers", 30*time.Second, func(w map[string]string) bool { return len(w) == 3 })
			// The unbroken run's text, from the healthy engine itself.
			res, err := do(t.Context(), http.MethodPost, healthyURL+"/v1/chat/completions", chatBody(false, prompt, maxTokens), nil)
			if err != nil || res.status != http.StatusOK {
				t.Fatalf("unbroken run: %v %+v", err, res)
			}
			var unbroken struct {
				Choices []struct{ Message struct{ Content string } }
			}
			if err := json.Unmarshal(res.body, &unbroken); err != nil || len(unbroken.Choices) != 1 {
				t.Fatalf("unbroken run: %s: %v", res.body, err)
			}
			check := map[string]string{"openai": "chat_stream_continued", "anthropic": "messages_stream_continued"}[sdk]
			runSDK(t, modules, sdk, f.base, "none", check,
				"CONT_PROMPT="+prompt, "CONT_TEXT="+unbroken.Choices[0].Message.Content, "CONT_MAX_TOKENS=60")
			if n := metricValue(scrape(t, f.base+"/metrics"), "infera_migrations_total"); n < 1 {
				t.Errorf("%v continuations, want at least one (the dying engines broke no stream)", n)
			}
		})
	}
}

// waitModelServed waits until a chat for sim-model is answered 200.
func waitModelServed(t *testing.T, base, key string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := do(t.Context(), http.MethodPost, base+"/v1/chat/completions", chatBody(false, "warm up", 1), map[string]string{"Authorization": "Bearer " + key})
		if err == nil && res.status == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sim-model never served: %v %+v", err, res)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
