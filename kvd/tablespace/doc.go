// Package tablespace owns kvd's L3 tier: a crash-safe, restart-surviving block
// store on local NVMe made of pre-allocated container files cut into fixed
// slots, with the whole index (key → slot, LRU, free bitset) held in RAM.
//
// On-disk layout, per path (several paths stripe keys by hash, each path is an
// independent shard with its own files and locks):
//
//	<path>/LOCK                      flock'd by the owning process
//	<path>/containers/0000.bin …     fixed size, fallocate'd, slot i of a container at i*SlotBytes
//	<path>/journal.log               checksummed records (PUT and every removal), reused across epochs
//	<path>/snapshot.bin              checksummed index image, replaced atomically
//
// Every slot carries a 32-byte header (magic, CRC-32C, sequence number, value
// length, key length) followed by the key and the value; a read checks all of
// them against the index entry, so a torn, stale or reused slot is reported as
// a miss (and counted in Stats.Corrupt) and never served as data.
//
// Write path: reserve a slot (evicting the LRU entry when full; the eviction's
// DEL record is made durable before the slot is overwritten) → write and sync
// the data (an O_DSYNC write, as dd oflag=dsync) → append and sync the journal
// record → update the index. A slot is returned to the free set only after
// the record that orphaned it is durable.
// An overwrite goes to a fresh slot (the old copy stays valid until the new
// one is durable), so overwriting in a full tablespace evicts the LRU entry.
// With Config.GroupCommit, concurrent writers share data and journal syncs.
// Recovery = snapshot + replay of the journal of the same epoch; a torn or
// corrupt tail is cut at the last whole record.
//
// Concurrency: a *Tablespace is safe for concurrent use by many goroutines.
// Put returns once the block is durable. Close must not race with other calls
// (calls after Close return ErrClosed). A WriteBehind is safe for concurrent
// Enqueue; its Close drains the queue. One process owns a path at a time
// (a second Open of the same path fails with ErrLocked).
package tablespace
