// Package resp is kvd's RESP listener (`infera kvd --resp-listen`): the
// Redis protocol (RESP2) over a kvd Store, so redis-cli, redis-benchmark,
// client libraries and LMCache's Redis and RESP remote backends use kvd
// unchanged.
//
// It owns the request parser (Parse: multibulk and inline requests,
// Redis's limits and protocol-error texts; fuzzed; an incomplete request
// reports a lower bound of its length, so a connection parses again only
// once that much arrived, and its input buffer grows with the bytes that
// arrived, never to a length a header claims), the connection cap
// (Options.MaxClients, Redis's maxclients reply), the output limits (a
// connection's requests wait in its input while 1 MiB of its replies are
// unwritten; Options.MaxOutputBytes and Options.OutputTimeout disconnect
// a client past them, counted, logged at most once per 10 s, exported by
// Collector) and the commands
// client start-up and key-value use need — HELLO (protocol 2; 3 is
// refused with Redis's NOPROTO error), PING, ECHO, AUTH (password or ACL
// user), SELECT 0, CLIENT SETNAME/SETINFO/GETNAME/ID, GET, SET
// (NX/XX/GET/EX/PX/EXAT/PXAT), MGET, MSET (all or nothing:
// kvd.Store.SetMany), EXISTS, DEL, DBSIZE, INFO,
// COMMAND (COUNT/INFO/DOCS), CONFIG GET, QUIT — with replies byte-exact
// as Redis RedisVersion gives them (checked against a real redis-server
// in the tests). Keys live in one kvd namespace (Options.Model and
// CompatKey) and values are stored with Options.Retention, so they go to
// the same tiers (RAM arena, L3, L4) as the UDS protocol's sets.
//
// Concurrency: a Server serves its connections from Options.Loops event
// loops (loop.go; one by default, as redis-server's one thread), each
// waiting in epoll for many sockets through Go's netpoller: a request
// costs one read and one write, pipelined replies go out in one write
// (written once every ready socket of the epoll batch has been read, as
// redis-server writes before it sleeps),
// and a reply the socket cannot take at once is written on EPOLLOUT while
// the connection is not read. A connection that is not a socket (a
// wrapped net.Conn) gets a goroutine of its own instead. Either way a
// connection owns its input and output buffers and handles its requests
// in order. Arguments alias the input buffer: a value is read from the
// socket once and copied once, into its arena slot — a SET value of 32 KiB
// or more is read from the socket straight into its slot (bigset.go:
// Store.BeginWrite/CommitWrite) and not copied at all; a GET copies once,
// from the slot into the output buffer (checked against a concurrent
// rewrite). GET, SET (large ones included) and MSET of an existing key
// allocate nothing.
package resp
