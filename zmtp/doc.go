// Package zmtp owns Infera's ZMTP 3.x plumbing for KV-event streams:
// tcp:// endpoint parsing (dial, bind, data-parallel rank offsets), the
// greeting and NULL-security handshake run through go-zeromq/zmq4's
// connection API with a deadline and a frame-size limit (LimitConn), frame
// writing (AppendFrame, AppendSeqMsg) and reading (Reader), and the
// constants of vLLM's replay protocol (ReplayEnd). kvcache's subscriber
// dials with it; the simulator's publisher and replay socket serve with it.
//
// zmq4's Socket types are deliberately not used (their goroutines cannot be
// cancelled mid-dial and outlive Close); callers own their net.Conn, and
// closing it stops everything reading or writing it.
//
// Concurrency: functions are safe for concurrent use; a LimitConn or Reader
// belongs to the one goroutine reading its connection.
package zmtp
