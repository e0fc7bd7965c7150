// Package peer moves KV blocks from one host's kvd to another's: the
// kvd-to-kvd pull a router directs when a request lands on host H while
// its prefix was last computed on host G.
//
// Two channels:
//   - locate (wire.go): the puller asks the source's control listener where
//     a namespace's keys lie in its shared arena; the source answers, per
//     key, the payload offset, length and seqlock version of a RAM arena
//     hit (L3 hits are promoted first; anything else is a miss), and the
//     transport descriptor of its arena region. Frames are bounded and
//     validated like the Unix-socket protocol; a shared secret, when set,
//     must open every request (compared in constant time).
//   - bytes (transport): the puller reads each slot — its 16-byte header and
//     payload — straight from the source's registered arena region with a
//     transport.Engine (the pure-Go TCP engine in every build; Mooncake or
//     MoRI in the GPU build), then reads the headers again: a slot whose
//     version is odd, differs from the located one, or changed during the
//     read, or whose length differs, is a miss (the seqlock of the protocol
//     document, across hosts). A source that dies mid-pull fails the
//     transfer: every key of the batch is a miss, never wrong bytes.
//
// A third exchange, the hint (hint.go), rides on the locate listener: a
// router (Hinter) asks a kvd to pull keys from a named source kvd and may
// wait, bounded, for the pull (Prefetcher.HintWait), so that the request
// it sends next finds the blocks in that kvd's RAM.
//
// Server serves locate requests for a Store and owns the arena's region on
// its engine; Puller pulls through its own engine into a reused scratch
// region. The control listener is off unless kvd is started with
// --peer-listen, and its connections can be limited to allowed networks
// and, with the kvd registry (kvd --etcd-endpoints), to the hosts of
// registered kvds (ServerOptions.Registered, fed by discovery's
// KVDWatcher in the kvd command; refusals are counted and logged at most
// once per 10 s). Server.Admit is the same decision for other listeners:
// the kvd command fences its arena's transport port with it. A Puller
// dials from its own host's address (Puller.SetSource) so that fenced
// sources recognise it.
//
// Concurrency: a Server serves connections concurrently (one goroutine
// each, owned and waited for by Serve; a hint waits on its connection's
// goroutine). A Puller is safe for concurrent use; pulls are serialised on
// its scratch region. A Hinter is safe for concurrent use (one exchange at
// a time per kept connection).
package peer
