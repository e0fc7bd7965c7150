package engines

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// ErrPortInUse is wrapped when the engine's port is held by a process the
// worker may not kill (not the engine it left behind).
var ErrPortInUse = errors.New("engine port in use")

// staleKillWait bounds the wait for a stale engine to disappear after
// SIGKILL.
const staleKillWait = 5 * time.Second

// DefaultRuntimeDir is where workers keep their engine pidfiles without
// --runtime-dir: $XDG_RUNTIME_DIR/infera, else <tmp>/infera-<uid>.
func DefaultRuntimeDir() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "infera")
	}
	return filepath.Join(os.TempDir(), "infera-"+strconv.Itoa(os.Getuid()))
}

// pidfile records the engine a worker started on one port: the pid on the
// first line, then the engine's /proc/PID/cmdline as read right after it
// started. A later worker for the same port kills that process only when
// both still match, so a recycled pid is never shot.
type pidfile struct {
	path string
}

func pidfilePath(dir string, port int) pidfile {
	return pidfile{path: filepath.Join(dir, "engine-"+strconv.Itoa(port)+".pid")}
}

// write records pid atomically (temporary file, then rename).
func (f pidfile) write(pid int) error {
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return fmt.Errorf("write engine pidfile: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(f.path), 0o700); err != nil {
		return fmt.Errorf("write engine pidfile: %w", err)
	}
	tmp := f.path + ".tmp"
	data := append([]byte(strconv.Itoa(pid)+"\n"), cmdline...)
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("write engine pidfile: %w", err)
	}
	if err := os.Rename(tmp, f.path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write engine pidfile: %w", err)
	}
	return nil
}

// remove deletes the pidfile if it still names pid (a newer worker on the
// same port may have replaced it).
func (f pidfile) remove(pid int) {
	if got, _, err := f.read(); err == nil && got == pid {
		_ = os.Remove(f.path)
	}
}

func (f pidfile) read() (int, []byte, error) {
	data, err := os.ReadFile(f.path)
	if err != nil {
		return 0, nil, err
	}
	line, cmdline, ok := bytes.Cut(data, []byte{'\n'})
	if !ok {
		return 0, nil, fmt.Errorf("pidfile %s: no pid line", f.path)
	}
	pid, err := strconv.Atoi(string(line))
	if err != nil || pid <= 1 {
		return 0, nil, fmt.Errorf("pidfile %s: bad pid %q", f.path, line)
	}
	return pid, cmdline, nil
}

// reclaim kills the engine a previous worker left behind on this port, if
// the pidfile names a live process whose command line is still the one
// recorded. It reports what it did; a missing or stale pidfile is not an
// error.
func (f pidfile) reclaim(log zerolog.Logger) error {
	pid, want, err := f.read()
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		log.Warn().Err(err).Msg("ignoring unreadable engine pidfile")
		_ = os.Remove(f.path)
		return nil
	}
	got, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || !bytes.Equal(got, want) || processGone(pid) {
		// Gone, or the pid now belongs to something else.
		_ = os.Remove(f.path)
		return nil
	}
	log.Warn().Int("pid", pid).Str("cmdline", printableCmdline(got)).Str("pidfile", f.path).
		Msg("killing the engine a previous worker left behind")
	target := pid
	if pgid, err := syscall.Getpgid(pid); err == nil && pgid == pid {
		target = -pid // the engine led its own group: take its helpers too
	}
	if err := syscall.Kill(target, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill stale engine %d: %w", pid, err)
	}
	deadline := time.Now().Add(staleKillWait)
	for !processGone(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("stale engine %d did not exit after SIGKILL", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = os.Remove(f.path)
	return nil
}

// processGone reports whether pid no longer runs: no such process, or a
// zombie waiting for its parent to reap it (it holds no port any more).
func processGone(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the parenthesised command name, which may itself
	// contain spaces and parentheses.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X'
}

func printableCmdline(b []byte) string {
	return strings.TrimSpace(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
}

// checkPortFree fails, wrapping ErrPortInUse, when something listens on
// host:port, naming the holder's pid and command line when /proc shows it.
// port 0 is always free.
func checkPortFree(host string, port int) error {
	if port == 0 {
		return nil
	}
	if host == "0.0.0.0" || host == "::" {
		host = ""
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		_ = ln.Close()
		return nil
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		return nil // e.g. an unresolvable host: the engine reports it better
	}
	pid := portHolder(port)
	if pid == 0 {
		return fmt.Errorf("%w: %s is held by another process (not found in /proc)", ErrPortInUse, addr)
	}
	cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return fmt.Errorf("%w: %s is held by pid %d (%s)", ErrPortInUse, addr, pid, printableCmdline(cmdline))
}

// portHolder finds the process with a TCP socket listening on port: the
// socket's inode from /proc/net/tcp{,6}, then the process whose fd table
// holds it. 0 when not found (another user's process, no /proc).
func portHolder(port int) int {
	inodes := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		listeningInodes(table, port, inodes)
	}
	if len(inodes) == 0 {
		return 0
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fdDir := "/proc/" + p.Name() + "/fd"
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			link, err := os.Readlink(fdDir + "/" + fd.Name())
			if err == nil && strings.HasPrefix(link, "socket:[") && inodes[strings.TrimSuffix(link[len("socket:["):], "]")] {
				return pid
			}
		}
	}
	return 0
}

// listeningInodes adds the inodes of the sockets of one /proc/net table in
// state LISTEN (0A) on port.
func listeningInodes(table string, port int, into map[string]bool) {
	f, err := os.Open(table)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" {
			continue
		}
		_, hexPort, ok := strings.Cut(fields[1], ":")
		if !ok {
			continue
		}
		if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(p) == port {
			into[fields[9]] = true
		}
	}
}
