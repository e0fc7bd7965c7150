package e2e

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// browser is a headless Chromium driven over the DevTools protocol on
// --remote-debugging-pipe: JSON messages separated by NUL bytes on the
// child's fds 3 (commands) and 4 (replies and events). No websocket, no
// third-party client: the few commands the dashboard tests need.
type browser struct {
	t       *testing.T
	cmd     *exec.Cmd
	in      io.WriteCloser
	session string

	mu      sync.Mutex
	nextID  int
	waiters map[int]chan cdpReply
	done    chan struct{}
}

type cdpReply struct {
	ID     int             `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// chromiumPath finds Debian's chromium (CI installs it: .ci/run).
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium is not installed (apt-get install chromium; .ci/run installs it)")
	return ""
}

// startBrowser launches headless Chromium with one page open on url.
func startBrowser(t *testing.T, url string) *browser {
	t.Helper()
	cmdR, cmdW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	b := &browser{t: t, in: cmdW, waiters: map[int]chan cdpReply{}, done: make(chan struct{})}
	b.cmd = exec.Command(chromiumPath(t), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--disable-extensions", "--hide-scrollbars", "--window-size=1400,900",
		"--user-data-dir="+filepath.Join(t.TempDir(), "chromium"), "--remote-debugging-pipe", "about:blank")
	b.cmd.ExtraFiles = []*os.File{cmdR, outW} // fds 3 and 4
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := b.cmd.Start(); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	cmdR.Close()
	outW.Close()
	go b.read(outR)
	t.Cleanup(func() {
		_ = cmdW.Close()
		_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
		_ = b.cmd.Wait()
		<-b.done
		outR.Close()
	})
	var target struct {
		TargetID string `json:"targetId"`
	}
	b.call("", "Target.createTarget", map[string]any{"url": "about:blank"}, &target)
	var att struct {
		SessionID string `json:"sessionId"`
	}
	b.call("", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &att)
	b.session = att.SessionID
	b.call(b.session, "Page.enable", nil, nil)
	b.call(b.session, "Page.navigate", map[string]any{"url": url}, nil)
	return b
}

func (b *browser) read(r io.Reader) {
	defer close(b.done)
	br := bufio.NewReaderSize(r, 1<<20)
	for {
		msg, err := br.ReadBytes(0)
		if err != nil {
			b.mu.Lock()
			for id, ch := range b.waiters {
				close(ch)
				delete(b.waiters, id)
			}
			b.mu.Unlock()
			return
		}
		var rep cdpReply
		if json.Unmarshal(msg[:len(msg)-1], &rep) != nil || rep.ID == 0 {
			continue // an event
		}
		b.mu.Lock()
		ch := b.waiters[rep.ID]
		delete(b.waiters, rep.ID)
		b.mu.Unlock()
		if ch != nil {
			ch <- rep
		}
	}
}

// call sends one command and decodes its result into out (if not nil).
func (b *browser) call(session, method string, params any, out any) {
	b.t.Helper()
	b.mu.Lock()
	b.nextID++
	id := b.nextID
	ch := make(chan cdpReply, 1)
	b.waiters[id] = ch
	b.mu.Unlock()
	msg := map[string]any{"id": id, "method": method}
	if params != nil {
		msg["params"] = params
	}
	if session != "" {
		msg["sessionId"] = session
	}
	data, err := json.Marshal(msg)
	if err != nil {
		b.t.Fatal(err)
	}
	if _, err := b.in.Write(append(data, 0)); err != nil {
		b.t.Fatalf("cdp %s: %v", method, err)
	}
	select {
	case rep, ok := <-ch:
		if !ok {
			b.t.Fatalf("cdp %s: chromium went away", method)
		}
		if rep.Error != nil {
			b.t.Fatalf("cdp %s: %s", method, rep.Error.Message)
		}
		if out != nil {
			if err := json.Unmarshal(rep.Result, out); err != nil {
				b.t.Fatalf("cdp %s result %s: %v", method, rep.Result, err)
			}
		}
	case <-time.After(30 * time.Second):
		b.t.Fatalf("cdp %s: no reply in 30s", method)
	}
}

// eval evaluates a JavaScript expression in the page and decodes its
// (JSON-serialisable) value into out.
func (b *browser) eval(expr string, out any) {
	b.t.Helper()
	var res struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text string `json:"text"`
		} `json:"exceptionDetails"`
	}
	b.call(b.session, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true, "awaitPromise": true}, &res)
	if res.ExceptionDetails != nil {
		b.t.Fatalf("eval %q: %s", expr, res.ExceptionDetails.Text)
	}
	if out != nil && len(res.Result.Value) > 0 {
		if err := json.Unmarshal(res.Result.Value, out); err != nil {
			b.t.Fatalf("eval %q value %s: %v", expr, res.Result.Value, err)
		}
	}
}

// waitEval polls expr (a boolean expression) until it is true.
func (b *browser) waitEval(what, expr string, timeout time.Duration) time.Duration {
	b.t.Helper()
	start := time.Now()
	for {
		var ok bool
		b.eval("!!("+expr+")", &ok)
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			b.t.Fatalf("page: timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// screenshot writes a PNG of the page to path when INFERA_SCREENSHOTS names
// a directory (docs/img is refreshed that way); path is relative to it.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	dir := os.Getenv("INFERA_SCREENSHOTS")
	if dir == "" {
		return
	}
	var res struct {
		Data string `json:"data"`
	}
	b.call(b.session, "Page.captureScreenshot", map[string]any{"format": "png"}, &res)
	png, err := base64.StdEncoding.DecodeString(res.Data)
	if err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		b.t.Fatal(fmt.Errorf("screenshot: %w", err))
	}
}
