package engines

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// Errors of the process supervisor.
var (
	// ErrStillRunning is what ExitErr reports before the process has been reaped.
	ErrStillRunning = errors.New("process still running")
	// ErrExited is wrapped by errors that report the engine process ending
	// while something still needed it (readiness, serving).
	ErrExited = errors.New("engine process exited")
	// ErrNotHealthy is wrapped when readiness polling gives up at its deadline.
	ErrNotHealthy = errors.New("engine not healthy")
)

const (
	// maxLogLine bounds one captured output line; longer lines are logged in
	// pieces of this size with truncated=true, so a runaway engine cannot make
	// the worker buffer without limit.
	maxLogLine = 8 << 10
	// outputDrainWait bounds how long the reaper waits, after the process
	// group is gone, for the output readers to reach end of file. Something
	// that escaped the group (setsid) may still hold the pipes open; it must
	// not keep Done from closing.
	outputDrainWait = 2 * time.Second
)

// Command describes one engine process to start.
type Command struct {
	// Name labels the process in logs (the "engine" field), e.g. "sim".
	Name string
	// Path is the executable; a name without a slash is looked up in PATH.
	Path string
	// Args are the arguments after the program name.
	Args []string
	// Env is appended to the worker's environment (KEY=VALUE); later
	// entries win, as in exec.Cmd.
	Env []string
	// Dir is the working directory; empty means the worker's.
	Dir string
}

// Process is a started engine process, supervised in its own process group.
// One goroutine (the reaper) waits for it; Done and ExitErr publish the
// result. All methods are safe for concurrent use.
type Process struct {
	name string
	pid  int
	log  zerolog.Logger

	done    chan struct{} // closed by the reaper after exitErr is set
	exitErr error         // written once by the reaper before done is closed

	mu       sync.Mutex
	stopping bool // the first Stop has sent SIGTERM
	killed   bool // SIGKILL was sent (logged once)
}

// Start launches cmd in a new process group, with its stdout and stderr
// captured line by line into log (fields engine, pid, stream), and starts the
// single reaper goroutine. Start takes no context on purpose: only Stop (or
// the engine's own exit) ends the process, so the caller decides how it is
// taken down (drain first, then SIGTERM with grace).
func Start(cmd Command, log zerolog.Logger) (*Process, error) {
	if cmd.Path == "" {
		return nil, errors.New("start engine: empty executable path")
	}
	// The engine gets its own process group so that a terminal's Ctrl-C
	// reaches only the worker (which then drains) and so that Stop can signal
	// everything the engine forked.
	c := exec.Command(cmd.Path, cmd.Args...)
	c.Dir = cmd.Dir
	if len(cmd.Env) > 0 {
		c.Env = append(os.Environ(), cmd.Env...)
	}
	// Pdeathsig: the kernel SIGKILLs the engine when the worker dies, however
	// it dies (SIGKILL included), so no engine is orphaned to PID 1 holding
	// its port and GPU memory. See startLocked for why the fork happens on a
	// thread of its own.
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}

	// Pipes are made here rather than with StdoutPipe so that cmd.Wait does
	// not close the read ends under the readers: the readers own them and
	// stop at end of file, after the last line was logged.
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("start engine %s: stdout pipe: %w", cmd.Name, err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(outR, outW)
		return nil, fmt.Errorf("start engine %s: stderr pipe: %w", cmd.Name, err)
	}
	c.Stdout = outW
	c.Stderr = errW
	p := &Process{name: cmd.Name, done: make(chan struct{})}
	var readers sync.WaitGroup
	if err := startLocked(c, func() {
		// The child holds its own copies of the write ends; ours must go
		// so the readers see end of file when the engine side closes.
		closeAll(outW, errW)
		p.pid = c.Process.Pid
		p.log = log.With().Str("engine", cmd.Name).Int("pid", c.Process.Pid).Logger()
		readers.Add(2)
		go p.capture(&readers, outR, "stdout")
		go p.capture(&readers, errR, "stderr")
	}, func() { p.reap(c, &readers, outR, errR) }); err != nil {
		closeAll(outR, outW, errR, errW)
		return nil, fmt.Errorf("start engine %s: %w", cmd.Name, err)
	}
	p.log.Info().Str("path", cmd.Path).Strs("args", cmd.Args).Msg("engine started")
	return p, nil
}

// startLocked starts c from a goroutine locked to its OS thread and keeps
// that goroutine, and so the thread, alive until the process is reaped:
// started runs once the process exists, then reap runs on the same thread
// (it waits for the process). Linux delivers the parent-death signal
// (Pdeathsig) when the thread that forked the child exits, not the process;
// a plain exec.Cmd.Start on an arbitrary goroutine could let the runtime
// retire that thread and kill a healthy engine. A goroutine that returns
// while locked takes its thread with it, which by then is harmless: the
// engine has been reaped. startLocked returns once c.Start has returned.
func startLocked(c *exec.Cmd, started, reap func()) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Never unlocked: the thread ends with this goroutine.
		if err := c.Start(); err != nil {
			errc <- err
			return
		}
		started()
		errc <- nil
		reap()
	}()
	return <-errc
}

// PID returns the process id, which is also its process group id.
func (p *Process) PID() int { return p.pid }

// Done is closed once the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitErr returns ErrStillRunning before Done is closed; afterwards nil for
// a zero exit status, otherwise the error from exec (e.g. "exit status 1",
// "signal: killed").
func (p *Process) ExitErr() error {
	select {
	case <-p.done:
		return p.exitErr
	default:
		return ErrStillRunning
	}
}

// reap is the only caller of Wait. After the leader exits it kills what is
// left of the group: the group belongs to the engine and nothing of it may
// outlive the engine (orphaned helpers would keep GPU memory or ports).
func (p *Process) reap(c *exec.Cmd, readers *sync.WaitGroup, outR, errR *os.File) {
	err := c.Wait()
	p.signalGroup(syscall.SIGKILL)

	drained := make(chan struct{})
	go func() {
		readers.Wait()
		close(drained)
	}()
	timer := time.NewTimer(outputDrainWait)
	select {
	case <-drained:
		timer.Stop()
	case <-timer.C:
		// Closing the read ends unblocks the readers (os.Pipe files use the
		// runtime poller), so they return and drained closes.
		closeAll(outR, errR)
		<-drained
	}
	closeAll(outR, errR)

	ev := p.log.Info()
	if err != nil {
		ev = p.log.Warn().Str("exit", err.Error())
	}
	ev.Msg("engine exited")
	p.exitErr = err
	close(p.done)
}

// capture logs r line by line until end of file.
func (p *Process) capture(wg *sync.WaitGroup, r *os.File, stream string) {
	defer wg.Done()
	log := p.log.With().Str("stream", stream).Logger()
	br := bufio.NewReaderSize(r, maxLogLine)
	cont := false // the previous piece was a truncated line's head
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			if !cont {
				log.Info().Bool("truncated", true).Msg(string(line))
			}
			cont = true
			continue
		case len(line) > 0 && !cont:
			log.Info().Msg(string(trimEOL(line)))
		}
		cont = false
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrClosed) {
				log.Debug().Err(err).Msg("engine output read failed")
			}
			return
		}
	}
}

func trimEOL(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
		if n := len(b); n > 0 && b[n-1] == '\r' {
			b = b[:n-1]
		}
	}
	return b
}

// Stop ends the process group: SIGTERM, then SIGKILL once grace has passed
// (grace <= 0 kills at once). It returns when the process has been reaped,
// or with ctx's error (after sending SIGKILL) if ctx ends first. Calling it
// again, concurrently or after the process is gone, is harmless: SIGTERM is
// sent once, each caller escalates after its own grace, and all of them wait
// for the same reaper.
func (p *Process) Stop(ctx context.Context, grace time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if grace <= 0 {
		p.kill("stop without grace")
	} else {
		p.mu.Lock()
		first := !p.stopping
		p.stopping = true
		p.mu.Unlock()
		if first {
			p.log.Info().Dur("grace", grace).Msg("stopping engine")
			p.signalGroup(syscall.SIGTERM)
		}
		timer := time.NewTimer(grace)
		defer timer.Stop()
		select {
		case <-p.done:
			return nil
		case <-timer.C:
			p.kill("engine did not stop within grace")
		case <-ctx.Done():
			p.kill("stop cancelled")
			return fmt.Errorf("stop engine %s: %w", p.name, ctx.Err())
		}
	}
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop engine %s: %w", p.name, ctx.Err())
	}
}

// kill sends SIGKILL to the group; the reason is logged by the first kill.
func (p *Process) kill(reason string) {
	p.mu.Lock()
	first := !p.killed
	p.killed = true
	p.mu.Unlock()
	if first {
		p.log.Warn().Str("reason", reason).Msg("killing engine process group")
	}
	p.signalGroup(syscall.SIGKILL)
}

// signalGroup signals the whole process group. ESRCH (nothing left) is the
// normal end of a stop and not worth reporting.
func (p *Process) signalGroup(sig syscall.Signal) {
	if err := syscall.Kill(-p.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		p.log.Warn().Err(err).Str("signal", sig.String()).Msg("signal engine process group failed")
	}
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		_ = f.Close() // a second close reports ErrClosed, which is expected here
	}
}
