package resp

import (
	"context"
	"crypto/subtle"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/infera/infera/kvd"
)

// RedisVersion is the Redis release whose replies the listener matches
// byte for byte (checked against that redis-server in the tests); HELLO
// and INFO report it as redis_version, which client libraries read to
// decide what they may send.
const RedisVersion = "7.0.15"

// Options configure a Server.
type Options struct {
	// Model and CompatKey are the kvd namespace RESP keys live in.
	Model, CompatKey string
	// Retention is the class of values SET stores ("none", "ephemeral",
	// "short" or "long"; "" = short); long values go down to L3 and L4
	// like protocol sets.
	Retention string
	// User and Password, when Password is set, require AUTH (or HELLO
	// AUTH) before anything else; User "" is Redis's "default".
	User, Password string
	// MaxBulkBytes bounds one argument (Redis's proto-max-bulk-len);
	// MaxRequestBytes one pipelined request's buffer (Redis's
	// client-query-buffer-limit: a client over it is disconnected).
	MaxBulkBytes    int
	MaxRequestBytes int
	// Loops is how many event loops serve the connections (0 = 1, as
	// redis-server's one thread: on a host the clients share, one loop
	// costs the least CPU per request). A command that reads L3 or L4
	// holds its loop meanwhile; more loops keep other clients moving.
	Loops int
	// MaxClients caps the open connections (Redis's maxclients; 0 =
	// 10000): one more is sent errMaxClients and closed.
	MaxClients int
	// MaxOutputBytes bounds the replies waiting to be written to one
	// client (Redis's client-output-buffer-limit hard limit; 0 = 1 GiB):
	// a client past it is disconnected at once, its replies dropped. A
	// client's requests are answered only while fewer than 1 MiB of its
	// replies wait (the rest of its input waits for them), so only one
	// command's reply can pass it: an MGET of many large values. One
	// value alone never does (a GET is always answered).
	MaxOutputBytes int
	// OutputTimeout disconnects a client whose replies have waited that
	// long while its socket took none of them — one that sends requests
	// and does not read (Redis's soft limit and its seconds; 0 = 60 s,
	// negative = never).
	OutputTimeout time.Duration
	Log           zerolog.Logger
}

// errMaxClients is redis-server's reply to a connection over maxclients.
const errMaxClients = "-ERR max number of clients reached\r\n"

// Counters are the listener's own counters (INFO and metrics).
type Counters struct {
	ConnsActive, ConnsTotal, Commands, ProtocolErrors atomic.Int64
	// Refused counts connections closed over MaxClients.
	Refused atomic.Int64
	// OutputLimit and OutputStalled count clients disconnected over
	// MaxOutputBytes and OutputTimeout.
	OutputLimit, OutputStalled atomic.Int64
	// BigSets counts SET values read straight into their arena slots
	// (bigset.go).
	BigSets atomic.Int64
}

// Server is the RESP listener over a kvd Store.
type Server struct {
	st    *kvd.Store
	opt   Options
	model []byte
	compt []byte
	ret   []byte
	user  string
	start time.Time

	C      Counters
	nextID atomic.Uint64

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup

	outLog outputLog
}

// Sentinel errors.
var (
	// ErrConfig reports invalid Options.
	ErrConfig = errors.New("resp: invalid options")
	// ErrRequestTooLarge: a client's unanswered requests outgrew
	// MaxRequestBytes (its connection is closed).
	ErrRequestTooLarge = errors.New("resp: request buffer over the limit")
	// ErrOutputTooLarge: a client's unwritten replies passed
	// MaxOutputBytes (its connection is closed, the replies dropped).
	ErrOutputTooLarge = errors.New("resp: output buffer over the limit")
	// ErrOutputStalled: a client took none of its replies for
	// OutputTimeout (its connection is closed).
	ErrOutputStalled = errors.New("resp: client not reading its replies")
)

// NewServer makes a listener over st.
func NewServer(st *kvd.Store, opt Options) (*Server, error) {
	if opt.Retention == "" {
		opt.Retention = "short"
	}
	if _, ok := kvd.ParseRetention([]byte(opt.Retention)); !ok {
		return nil, errors.Join(ErrConfig, errors.New("retention "+strconv.Quote(opt.Retention)+": want none, ephemeral, short or long"))
	}
	if opt.MaxBulkBytes <= 0 {
		opt.MaxBulkBytes = 512 << 20
	}
	if opt.MaxRequestBytes <= 0 {
		opt.MaxRequestBytes = 1 << 30
	}
	if opt.MaxClients <= 0 {
		opt.MaxClients = 10000
	}
	if opt.Loops <= 0 {
		opt.Loops = 1
	}
	if opt.MaxOutputBytes <= 0 {
		opt.MaxOutputBytes = 1 << 30
	}
	if opt.OutputTimeout == 0 {
		opt.OutputTimeout = time.Minute
	}
	opt.MaxBulkBytes = min(opt.MaxBulkBytes, opt.MaxRequestBytes-64)
	user := opt.User
	if user == "" {
		user = "default"
	}
	return &Server{st: st, opt: opt, model: []byte(opt.Model), compt: []byte(opt.CompatKey), ret: []byte(opt.Retention),
		user: user, start: time.Now(), conns: map[net.Conn]struct{}{}}, nil
}

// Serve accepts connections until ctx ends, then closes them and waits
// for their goroutines.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	loops := s.startLoops()
	var err error
	var retry kvd.AcceptRetry
	for i := 0; ; i++ {
		c, aerr := ln.Accept()
		if aerr != nil {
			if retry.Wait(ctx, aerr, s.opt.Log, "resp") {
				continue
			}
			if ctx.Err() == nil {
				err = aerr
			}
			break
		}
		retry.Reset()
		if s.C.ConnsActive.Load() >= int64(s.opt.MaxClients) {
			// As redis-server at maxclients: the error, then close.
			s.C.Refused.Add(1)
			_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			_, _ = io.WriteString(c, errMaxClients)
			c.Close()
			continue
		}
		if len(loops) > 0 {
			taken, terr := loops[i%len(loops)].takeConn(c)
			if terr != nil {
				s.opt.Log.Warn().Err(terr).Msg("resp connection dropped")
			}
			if taken {
				continue
			}
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.handle(c)
	}
	for _, l := range loops {
		l.stop()
	}
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// conn is one client's state; its buffers are reused for every command.
type conn struct {
	s      *Server
	c      net.Conn
	id     uint64
	in     []byte
	r, w   int
	args   [][]byte
	out    []byte
	sc     kvd.Scratch
	set    kvd.SetArgs
	mset   kvd.SetManyArgs
	authed bool
	quit   bool
	name   []byte
	lower  [24]byte
	need   int  // length the request at the front needs, when known
	held   bool // requests wait in the input until the replies are written (holdOutput)
	over   bool // the replies passed MaxOutputBytes: close

	// Event-loop driver state (loop.go).
	fd       int
	outOff   int   // bytes of out already written
	waitOut  bool  // out is not all written: waiting for EPOLLOUT, not reading
	closing  bool  // close once out is written
	closeErr error // why (for the log)
	queued   bool  // in the loop's pending list (replies written at the end of the batch)
	dead     bool  // closed by the loop: a queued flush skips it
	stallAt  int64 // unix ns: waiting for EPOLLOUT since, or since the last bytes written
	big      bigSet
}

const (
	readBuf    = 64 << 10
	retainBuf  = 16 << 20
	maxNameLen = 24
	// holdOutput: with this many reply bytes waiting, a connection's next
	// request waits until they are written, so a client that does not
	// read costs about this much (and one command's reply), not a reply
	// per request its input holds.
	holdOutput = 1 << 20
)

func (s *Server) handle(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	s.C.ConnsTotal.Add(1)
	s.C.ConnsActive.Add(1)
	defer s.C.ConnsActive.Add(-1)
	cn := &conn{s: s, c: c, fd: -1, id: s.nextID.Add(1), in: make([]byte, readBuf), authed: s.opt.Password == ""}
	s.logClosed(cn, cn.serve())
}

// logClosed logs why a connection ended, unless the client ended it.
func (s *Server) logClosed(cn *conn, err error) {
	// Logged before counted: whoever sees the counter move finds the line.
	switch {
	case errors.Is(err, ErrOutputTooLarge):
		s.outLog.log(s.opt.Log, cn, err, "limit", int64(s.opt.MaxOutputBytes))
		s.C.OutputLimit.Add(1)
		return
	case errors.Is(err, ErrOutputStalled):
		s.outLog.log(s.opt.Log, cn, err, "stalled", int64(len(cn.out)-cn.outOff))
		s.C.OutputStalled.Add(1)
		return
	}
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, errEOF) && !errors.Is(err, errQuit) && !errors.Is(err, net.ErrClosed) &&
		!errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		s.opt.Log.Debug().Err(err).Uint64("client_id", cn.id).Msg("resp connection closed")
	}
}

// errQuit ends a connection after QUIT's reply is written.
var errQuit = errors.New("resp: quit")

// process answers every complete request in the input buffer into cn.out
// (written by the caller in one go: pipelined replies are batched) and
// readies the buffer for the next read: the unparsed tail moved to the
// front, grown once for a large request whose length is known. A non-nil
// error closes the connection once cn.out is written.
func (cn *conn) process() error {
	need := 0
	cn.held = false
	for cn.r < cn.w {
		if len(cn.out)-cn.outOff >= holdOutput {
			cn.held = true // replies first; the rest of the input stays
			break
		}
		args, n, nd, err := Parse(cn.in[cn.r:cn.w], cn.args, cn.s.opt.MaxBulkBytes, !cn.authed)
		cn.args = args
		if err != nil {
			cn.s.C.ProtocolErrors.Add(1)
			cn.out = appendErr(cn.out, "Protocol error: "+err.(*ProtocolError).Msg)
			return err
		}
		if n == 0 {
			need = nd
			break
		}
		cn.r += n
		if len(args) > 0 {
			cn.s.C.Commands.Add(1)
			cn.dispatch(args)
			if cn.over {
				return ErrOutputTooLarge
			}
			if cn.quit {
				return errQuit
			}
		}
	}
	if cn.r == cn.w {
		cn.r, cn.w = 0, 0
		if len(cn.in) > retainBuf {
			cn.in = make([]byte, readBuf)
		}
	} else if cn.r > 0 {
		cn.w = copy(cn.in, cn.in[cn.r:cn.w])
		cn.r = 0
	}
	if !cn.held && max(need, cn.w+1) > cn.s.opt.MaxRequestBytes {
		return ErrRequestTooLarge
	}
	// The buffer doubles when full of bytes that arrived, never to a
	// length a bulk header merely claims: a "$500000000" header and three
	// bytes cost one read buffer, not 500 MB.
	if cn.w == len(cn.in) && !cn.held {
		cn.in = append(cn.in, make([]byte, min(len(cn.in), cn.s.opt.MaxRequestBytes-len(cn.in)))...)
	}
	cn.need = need
	return nil
}

// resetOut empties the output buffer once it is written, dropping one
// that grew past retainBuf.
func (cn *conn) resetOut() {
	if cap(cn.out) > retainBuf {
		cn.out = nil
	}
	cn.out, cn.outOff = cn.out[:0], 0
}

// serve drives a connection the event loop cannot take (one that is not
// a syscall.Conn) from its own goroutine.
func (cn *conn) serve() error {
	for {
		perr := cn.process()
		if errors.Is(perr, ErrOutputTooLarge) {
			return perr // dropped, not written
		}
		if len(cn.out) > 0 {
			err := cn.writeOut()
			cn.resetOut()
			if err != nil {
				return err
			}
		}
		if perr != nil {
			return perr
		}
		if cn.held {
			continue // the requests already read, before reading more
		}
		for {
			n, err := cn.c.Read(cn.in[cn.w:])
			cn.w += n
			if err != nil {
				return err
			}
			if !cn.incomplete() {
				break
			}
		}
	}
}

// writeOut writes cn.out from the connection's goroutine; a client that
// takes none of it for OutputTimeout is ErrOutputStalled.
func (cn *conn) writeOut() error {
	b := cn.out
	for {
		if t := cn.s.opt.OutputTimeout; t > 0 {
			_ = cn.c.SetWriteDeadline(time.Now().Add(t))
		}
		n, err := cn.c.Write(b)
		b = b[n:]
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		if n == 0 {
			return ErrOutputStalled
		}
	}
}

// incomplete says whether the buffer cannot yet hold the pending request
// (fewer bytes than Parse's lower bound, and room to read more): parsing
// again would only re-read the same prefix.
func (cn *conn) incomplete() bool {
	return cn.big.reading() || cn.w < cn.need && cn.w < len(cn.in)
}

// lowerName lower-cases a command name into the connection's scratch
// (nil when too long to be a command).
func (cn *conn) lowerName(b []byte) []byte {
	if len(b) > len(cn.lower) {
		return nil
	}
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		cn.lower[i] = c
	}
	return cn.lower[:len(b)]
}

func (cn *conn) lookup(args [][]byte) (*command, bool) {
	name := cn.lowerName(args[0])
	cmd := commands[string(name)]
	if cmd == nil || !cmd.container() || len(args) == 1 {
		return cmd, false
	}
	sub := args[1]
	if len(name)+1+len(sub) > len(cn.lower) {
		return nil, true
	}
	full := cn.lower[:len(name)+1+len(sub)]
	full[len(name)] = '|'
	for i, c := range sub {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		full[len(name)+1+i] = c
	}
	return commands[string(full)], true
}

func (cn *conn) dispatch(args [][]byte) {
	cmd, isSub := cn.lookup(args)
	switch {
	case cmd == nil && isSub:
		cn.out = append(cn.out, "-ERR unknown subcommand '"...)
		cn.out = appendTrunc(cn.out, args[1], 128)
		cn.out = append(cn.out, "'. Try "...)
		for _, c := range args[0] {
			if c >= 'a' && c <= 'z' {
				c -= 'a' - 'A'
			}
			cn.out = append(cn.out, c)
		}
		cn.out = append(cn.out, " HELP.\r\n"...)
		return
	case cmd == nil:
		cn.unknownCommand(args)
		return
	case (cmd.arity > 0 && len(args) != cmd.arity) || len(args) < -cmd.arity:
		cn.out = appendErr(cn.out, "wrong number of arguments for '"+cmd.name+"' command")
		return
	case !cn.authed && !cmd.noAuth:
		cn.out = append(cn.out, replyNoAuth...)
		return
	}
	switch cmd.id {
	case cmdGet:
		cn.get(args[1])
	case cmdSet:
		cn.setCmd(args)
	case cmdMGet:
		cn.out = appendArray(cn.out, len(args)-1)
		for _, k := range args[1:] {
			cn.get(k)
		}
	case cmdMSet:
		if len(args)%2 == 0 {
			cn.out = appendErr(cn.out, "wrong number of arguments for 'mset' command")
			return
		}
		// All or nothing, as in Redis (where MSET is refused whole at
		// maxmemory): a pair kvd cannot store leaves every key as it was.
		m := &cn.mset
		m.Model, m.CompatKey, m.Pairs, m.Retention = cn.s.model, cn.s.compt, args[1:], cn.s.ret
		ok, reason := cn.s.st.SetMany(m)
		m.Pairs = nil
		if !ok {
			cn.refused(reason)
			return
		}
		cn.out = append(cn.out, replyOK...)
	case cmdExists:
		n := 0
		for _, k := range args[1:] {
			if cn.s.st.Exists(cn.s.model, cn.s.compt, k, &cn.sc) {
				n++
			}
		}
		cn.out = appendInt(cn.out, int64(n))
	case cmdDel:
		n := 0
		for _, k := range args[1:] {
			if cn.s.st.Delete(cn.s.model, cn.s.compt, k, &cn.sc) {
				n++
			}
		}
		cn.out = appendInt(cn.out, int64(n))
	case cmdPing:
		switch len(args) {
		case 1:
			cn.out = append(cn.out, replyPong...)
		case 2:
			cn.out = appendBulk(cn.out, args[1])
		default:
			cn.out = appendErr(cn.out, "wrong number of arguments for 'ping' command")
		}
	case cmdEcho:
		cn.out = appendBulk(cn.out, args[1])
	case cmdAuth:
		cn.auth(args)
	case cmdHello:
		cn.hello(args)
	case cmdSelect:
		if v, ok := parseInt(args[1]); !ok {
			cn.out = append(cn.out, replyNotInt...)
		} else if v < -1<<31 || v > 1<<31-1 {
			cn.out = appendErr(cn.out, "value is out of range, value must between -2147483648 and 2147483647")
		} else if v != 0 {
			cn.out = appendErr(cn.out, "DB index is out of range")
		} else {
			cn.out = append(cn.out, replyOK...)
		}
	case cmdInfo:
		cn.out = appendBulk(cn.out, cn.s.info())
	case cmdDBSize:
		cn.out = appendInt(cn.out, cn.s.st.Counters().Entries)
	case cmdQuit:
		cn.out = append(cn.out, replyOK...)
		cn.quit = true
	case cmdClientSetName:
		if !validName(args[2]) {
			cn.out = appendErr(cn.out, "Client names cannot contain spaces, newlines or special characters.")
			return
		}
		cn.name = append(cn.name[:0], args[2]...)
		cn.out = append(cn.out, replyOK...)
	case cmdClientSetInfo:
		attr := cn.lowerName(args[2])
		switch string(attr) {
		case "lib-name", "lib-ver":
			if !validName(args[3]) {
				cn.out = appendErr(cn.out, lib(attr)+" cannot contain spaces, newlines or special characters.")
				return
			}
			cn.out = append(cn.out, replyOK...)
		default:
			cn.out = append(cn.out, "-ERR Unrecognized option '"...)
			cn.out = appendTrunc(cn.out, args[2], len(args[2])) // CR/LF become spaces
			cn.out = append(cn.out, "'\r\n"...)
		}
	case cmdClientGetName:
		if len(cn.name) == 0 {
			cn.out = append(cn.out, replyNil...)
		} else {
			cn.out = appendBulk(cn.out, cn.name)
		}
	case cmdClientID:
		cn.out = appendInt(cn.out, int64(cn.id))
	case cmdCommand:
		cn.out = append(cn.out, commandReply...)
	case cmdCommandCount:
		cn.out = appendInt(cn.out, int64(len(commandTable)))
	case cmdCommandInfo:
		cn.out = appendArray(cn.out, len(args)-2)
		for _, name := range args[2:] {
			if c := lookupName(name); c != nil && !isSubName(c.name) {
				cn.out = appendInfo(cn.out, c)
			} else {
				cn.out = append(cn.out, replyNil...)
			}
		}
	case cmdCommandDocs:
		cn.out = appendArray(cn.out, 0)
	case cmdConfigGet:
		cn.configGet(args[2:])
	}
}

func isSubName(n string) bool {
	for i := 0; i < len(n); i++ {
		if n[i] == '|' {
			return true
		}
	}
	return false
}

func lib(attr []byte) string {
	if string(attr) == "lib-name" {
		return "lib-name"
	}
	return "lib-ver"
}

// validName is Redis's validateClientName: printable ASCII without space.
func validName(b []byte) bool {
	for _, c := range b {
		if c < '!' || c > '~' {
			return false
		}
	}
	return true
}

func appendTrunc(b, s []byte, n int) []byte {
	if len(s) > n {
		s = s[:n]
	}
	for _, c := range s {
		if c == '\r' || c == '\n' {
			c = ' '
		}
		b = append(b, c)
	}
	return b
}

// unknownCommand is Redis's "unknown command 'x', with args beginning
// with: 'a' 'b' " (argument text capped at 128 bytes overall).
func (cn *conn) unknownCommand(args [][]byte) {
	cn.out = append(cn.out, "-ERR unknown command '"...)
	cn.out = appendTrunc(cn.out, args[0], 128)
	cn.out = append(cn.out, "', with args beginning with: "...)
	l := 0
	for _, a := range args[1:] {
		if l >= 128 {
			break
		}
		cn.out = append(cn.out, '\'')
		n := min(len(a), 128-l)
		cn.out = appendTrunc(cn.out, a, n)
		cn.out = append(cn.out, '\'', ' ')
		l += n + 3
	}
	cn.out = append(cn.out, '\r', '\n')
}

// get appends a key's value (or nil) as a bulk string: the one copy a
// value makes on its way out is from its slot into the output buffer.
func (cn *conn) get(key []byte) {
	st := cn.s.st
	h := st.Get(cn.s.model, cn.s.compt, key, &cn.sc)
	if !h.Found {
		cn.out = append(cn.out, replyNil...)
		return
	}
	// Over the output limit before this value (an MGET of many large
	// values): the connection closes, its replies dropped.
	if len(cn.out)-cn.outOff > cn.s.opt.MaxOutputBytes || cn.over {
		cn.over = true
		return
	}
	mark := len(cn.out)
	cn.out = append(cn.out, '$')
	cn.out = strconv.AppendInt(cn.out, int64(h.Length), 10)
	cn.out = append(cn.out, '\r', '\n')
	var ok bool
	if cn.out, ok = st.AppendHit(cn.out, h); !ok {
		cn.out = append(cn.out[:mark], replyNil...)
		return
	}
	cn.out = append(cn.out, '\r', '\n')
}

// store sets one value; false means an error reply was written.
func (cn *conn) store(key, value []byte, ttlMs int64, hasTTL bool) bool {
	a := &cn.set
	*a = kvd.SetArgs{Model: cn.s.model, CompatKey: cn.s.compt, Key: key, Value: value, Retention: cn.s.ret}
	if hasTTL {
		a.TTL, a.HasTTL = float64(ttlMs)/1000, true
	}
	var ok bool
	var reason string
	if cn.big.ready { // this SET's value is in its slot (bigset.go)
		ok, reason = cn.storeBig(a)
	} else {
		ok, reason = cn.s.st.Set(a)
	}
	if !ok {
		cn.refused(reason)
	}
	return ok
}

// refused answers a value kvd would not store, with Redis's OOM error
// for memory and kvd's reason otherwise.
func (cn *conn) refused(reason string) {
	switch reason {
	case kvd.ReasonDisplaceHigher:
		cn.out = append(cn.out, replyOOMHeld...)
	case kvd.ReasonLargerThanStore:
		cn.out = append(cn.out, replyOOMLarge...)
	case kvd.ReasonArenaFull:
		cn.out = append(cn.out, replyOOM...)
	default:
		cn.out = appendErr(cn.out, "kvd refused the value: "+reason)
	}
}

const (
	setNX = 1 << iota
	setXX
	setGet
	setEX
	setPX
	setEXAT
	setPXAT
)

func eqFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// setCmd is SET key value [NX|XX] [GET] [EX s|PX ms|EXAT t|PXAT t], with
// Redis 7.0's option parsing (parseExtendedStringArgumentsOrReply) and
// errors.
func (cn *conn) setCmd(args [][]byte) {
	if cn.big.ready { // stored below, or given back
		defer cn.dropBig()
	}
	flags := 0
	var expire []byte
	const anyTTL = setEX | setPX | setEXAT | setPXAT
	for j := 3; j < len(args); j++ {
		opt := args[j]
		hasNext := j < len(args)-1
		switch {
		case eqFold(opt, "nx") && flags&setXX == 0:
			flags |= setNX
		case eqFold(opt, "xx") && flags&setNX == 0:
			flags |= setXX
		case eqFold(opt, "get"):
			flags |= setGet
		case eqFold(opt, "ex") && flags&(anyTTL&^setEX) == 0 && hasNext:
			flags |= setEX
			j++
			expire = args[j]
		case eqFold(opt, "px") && flags&(anyTTL&^setPX) == 0 && hasNext:
			flags |= setPX
			j++
			expire = args[j]
		case eqFold(opt, "exat") && flags&(anyTTL&^setEXAT) == 0 && hasNext:
			flags |= setEXAT
			j++
			expire = args[j]
		case eqFold(opt, "pxat") && flags&(anyTTL&^setPXAT) == 0 && hasNext:
			flags |= setPXAT
			j++
			expire = args[j]
		default:
			cn.out = append(cn.out, replySyntax...)
			return
		}
	}
	var ttlMs int64
	hasTTL := expire != nil
	if hasTTL {
		v, ok := parseInt(expire)
		if !ok {
			cn.out = append(cn.out, replyNotInt...)
			return
		}
		if v <= 0 || (flags&(setEX|setEXAT) != 0 && v > (1<<63-1)/1000) {
			cn.out = appendErr(cn.out, "invalid expire time in 'set' command")
			return
		}
		switch {
		case flags&setEX != 0:
			ttlMs = v * 1000
		case flags&setPX != 0:
			ttlMs = v
		}
		// Redis adds the relative time to now and refuses a sum that
		// wrapped past LLONG_MAX.
		if flags&(setEX|setPX) != 0 && ttlMs > math.MaxInt64-time.Now().UnixMilli() {
			cn.out = appendErr(cn.out, "invalid expire time in 'set' command")
			return
		}
		switch {
		case flags&(setEX|setPX) != 0:
		case flags&setEXAT != 0:
			ttlMs = v*1000 - time.Now().UnixMilli()
		default:
			ttlMs = v - time.Now().UnixMilli()
		}
	}
	key, value := args[1], args[2]
	getMark := len(cn.out) // replies before this command's stay
	if flags&setGet != 0 {
		cn.get(key) // the old value is the reply
	}
	if flags&(setNX|setXX) != 0 {
		exists := cn.s.st.Exists(cn.s.model, cn.s.compt, key, &cn.sc)
		if (flags&setNX != 0 && exists) || (flags&setXX != 0 && !exists) {
			if flags&setGet == 0 {
				cn.out = append(cn.out, replyNil...)
			}
			return
		}
	}
	if hasTTL && ttlMs <= 0 { // an absolute time in the past: stored and expired at once
		cn.s.st.Delete(cn.s.model, cn.s.compt, key, &cn.sc)
	} else if mark := len(cn.out); !cn.store(key, value, ttlMs, hasTTL) {
		if flags&setGet != 0 { // the error replaces the old value
			n := copy(cn.out[getMark:], cn.out[mark:])
			cn.out = cn.out[:getMark+n]
		}
		return
	}
	if flags&setGet == 0 {
		cn.out = append(cn.out, replyOK...)
	}
}

func (cn *conn) checkPass(user, pass []byte) bool {
	if string(user) != cn.s.user {
		return false
	}
	if cn.s.opt.Password == "" {
		return true // the default user without a password takes any
	}
	return subtle.ConstantTimeCompare(pass, []byte(cn.s.opt.Password)) == 1
}

func (cn *conn) auth(args [][]byte) {
	if len(args) > 3 {
		cn.out = append(cn.out, replySyntax...)
		return
	}
	if len(args) == 2 {
		if cn.s.opt.Password == "" && cn.s.opt.User == "" {
			cn.out = appendErr(cn.out, "AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?")
			return
		}
		if cn.s.user != "default" || !cn.checkPass([]byte("default"), args[1]) {
			cn.out = append(cn.out, replyBadPass...)
			return
		}
	} else if !cn.checkPass(args[1], args[2]) {
		cn.out = append(cn.out, replyBadPass...)
		return
	}
	cn.authed = true
	cn.out = append(cn.out, replyOK...)
}

// hello is Redis 7.0's helloCommand for protocol 2; protocol 3 (RESP3)
// is refused with the error Redis gives for a version it lacks.
func (cn *conn) hello(args [][]byte) {
	if len(args) >= 2 {
		v, ok := parseInt(args[1])
		if !ok {
			cn.out = appendErr(cn.out, "Protocol version is not an integer or out of range")
			return
		}
		if v != 2 { // 3 is RESP3, which this listener does not speak
			cn.out = append(cn.out, replyNoProto...)
			return
		}
	}
	var user, pass, name []byte
	for j := 2; j < len(args); j++ {
		more := len(args) - 1 - j
		switch {
		case eqFold(args[j], "auth") && more >= 2:
			user, pass = args[j+1], args[j+2]
			j += 2
		case eqFold(args[j], "setname") && more >= 1:
			name = args[j+1]
			if !validName(name) {
				cn.out = appendErr(cn.out, "Client names cannot contain spaces, newlines or special characters.")
				return
			}
			j++
		default:
			// As addReplyErrorFormat: CR and LF become spaces, so an echoed
			// option cannot inject a reply.
			cn.out = append(cn.out, "-ERR Syntax error in HELLO option '"...)
			cn.out = appendTrunc(cn.out, args[j], len(args[j]))
			cn.out = append(cn.out, "'\r\n"...)
			return
		}
	}
	if user != nil {
		if !cn.checkPass(user, pass) {
			cn.out = append(cn.out, replyBadPass...)
			return
		}
		cn.authed = true
	}
	if !cn.authed {
		cn.out = append(cn.out, "-NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time\r\n"...)
		return
	}
	if name != nil {
		cn.name = append(cn.name[:0], name...)
	}
	cn.out = appendArray(cn.out, 14)
	cn.out = appendBulkString(cn.out, "server")
	cn.out = appendBulkString(cn.out, "redis")
	cn.out = appendBulkString(cn.out, "version")
	cn.out = appendBulkString(cn.out, RedisVersion)
	cn.out = appendBulkString(cn.out, "proto")
	cn.out = appendInt(cn.out, 2)
	cn.out = appendBulkString(cn.out, "id")
	cn.out = appendInt(cn.out, int64(cn.id))
	cn.out = appendBulkString(cn.out, "mode")
	cn.out = appendBulkString(cn.out, "standalone")
	cn.out = appendBulkString(cn.out, "role")
	cn.out = appendBulkString(cn.out, "master")
	cn.out = appendBulkString(cn.out, "modules")
	cn.out = appendArray(cn.out, 0)
}

// configGet answers the parameters clients read at start-up
// (redis-benchmark reads save and appendonly): kvd persists nothing the
// Redis way. Other names match nothing, as an unknown one does in Redis.
func (cn *conn) configGet(names [][]byte) {
	var pairs [][2]string
	for _, n := range names {
		switch {
		case eqFold(n, "save"):
			pairs = append(pairs, [2]string{"save", ""})
		case eqFold(n, "appendonly"):
			pairs = append(pairs, [2]string{"appendonly", "no"})
		case eqFold(n, "databases"):
			pairs = append(pairs, [2]string{"databases", "1"})
		}
	}
	cn.out = appendArray(cn.out, 2*len(pairs))
	for _, p := range pairs {
		cn.out = appendBulkString(cn.out, p[0])
		cn.out = appendBulkString(cn.out, p[1])
	}
}

// info is INFO's text: the fields client tools read, in Redis's layout.
func (s *Server) info() []byte {
	c := s.st.Counters()
	host, _ := os.Hostname()
	b := make([]byte, 0, 1024)
	line := func(k, v string) { b = append(append(append(append(b, k...), ':'), v...), '\r', '\n') }
	num := func(k string, v int64) { line(k, strconv.FormatInt(v, 10)) }
	b = append(b, "# Server\r\n"...)
	line("redis_version", RedisVersion)
	line("redis_mode", "standalone")
	line("server_name", "infera-kvd")
	line("os", runtime.GOOS+" "+runtime.GOARCH)
	num("arch_bits", strconv.IntSize)
	num("process_id", int64(os.Getpid()))
	line("hostname", host)
	num("uptime_in_seconds", int64(time.Since(s.start).Seconds()))
	b = append(b, "\r\n# Clients\r\n"...)
	num("connected_clients", s.C.ConnsActive.Load())
	b = append(b, "\r\n# Memory\r\n"...)
	num("used_memory", c.HostBytes)
	b = append(b, "\r\n# Stats\r\n"...)
	num("total_connections_received", s.C.ConnsTotal.Load())
	num("total_commands_processed", s.C.Commands.Load())
	num("evicted_keys", c.Evictions)
	num("expired_keys", c.Expired)
	num("keyspace_hits", c.Hits)
	num("keyspace_misses", c.Misses)
	b = append(b, "\r\n# Keyspace\r\n"...)
	if c.Entries > 0 {
		line("db0", "keys="+strconv.FormatInt(c.Entries, 10)+",expires=0,avg_ttl=0")
	}
	return b
}
