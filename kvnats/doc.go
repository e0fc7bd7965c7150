// Package kvnats carries engine KV events over NATS, Infera's production
// transport for them (--kv-event-transport nats), on the reference's wire:
//
//   - subjects infera.kv.events.<token>.<rank> (token: natsx.Token of the
//     worker id), captured by the INFERA_KV_EVENTS stream (limits
//     retention, file storage, discard old, 256 MiB, 1,000,000 messages);
//     payloads are the engine's msgpack batches, verbatim;
//   - the infera_kv_view bucket, key <token>.<rank>, value a msgpack array
//     of the rank's sorted router block hashes.
//
// Relay (worker side) subscribes to the engine's ZMQ publisher of every
// DP rank on 127.0.0.1, JetStream-publishes each payload and keeps each
// rank's view with the router's own index (so SGLang views are filled,
// unlike the reference's relay, which decodes with the vLLM schema only),
// writing it at most every 2 s and once more on Close.
//
// Feed (router side) feeds a kvcache.Index, the same index the ZMQ
// kvcache.Subscriber feeds, one followed (worker, rank) at a time: an
// ordered ephemeral consumer per rank with deliver policy all (the whole
// retained history in order, parents before children), the worker and
// rank parsed from each subject and checked, the bucket view seeding the
// rank before its history replays. One consumer per rank instead of the
// reference's one wildcard subscription: a worker the router learns after
// the replay still gets its history, and each consumer resumes after an
// outage where it stopped.
//
// Concurrency: Relay runs one goroutine per rank between Start and Close.
// Feed methods are safe for concurrent use; each rank's consumer delivers
// on one goroutine, the only writer of its index entry; Remove and Close
// wait for it.
package kvnats
