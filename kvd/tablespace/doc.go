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
// the data and append and sync the journal record, the two concurrently →
// update the index once both are durable; Put returns then. Without
// Config.GroupCommit the data is one O_DSYNC write (as dd oflag=dsync) on the
// caller's goroutine while the shard's flusher goroutine appends and
// fdatasyncs the record; with it, concurrent writers share syncs and a flush
// fdatasyncs the dirty containers while it syncs the journal. So a durable
// Put costs about one device flush, not two in series. Records are applied to
// the index in journal order, so recovery rebuilds the same index.
//
// Why the overlap is crash safe: a crash can leave a PUT record durable
// without its data. Recovery therefore checks every entry that a journalled
// PUT left in the index against its slot (key, sequence number, length,
// CRC-32C); one that fails is rejected and its key falls back to the mapping
// that PUT displaced (checked the same way), or is a miss for a new key. The
// displaced slot is still intact because a slot is freed only when the
// record that orphaned it is applied, which waits for that record's data;
// and a slot whose write failed is never reused before a restart. PUTs
// superseded later in the journal are not read, snapshot entries are trusted
// (only applied entries are in one), and so are PUTs before the journal's
// last mark: a record (opMark) that a flush writes in front of its batch once
// markEvery PUTs have finished since the last one, naming the journal offset
// up to which every PUT had its data durable. Recovery thus reads about
// markEvery slots plus those of the PUTs in flight at the crash (counted in
// Stats.ReplayChecked and Stats.ReplayRejected), and each Get verifies again.
// A snapshot waits until every durable record is applied.
// An overwrite goes to a fresh slot (the old copy stays valid until the new
// one is durable and applied), so overwriting in a full tablespace evicts the
// LRU entry.
// Recovery = snapshot + replay of the journal of the same epoch; a torn or
// corrupt tail is cut at the last whole record.
// A Get of a large value (≥ 256 KiB) overlaps its read and its check.
// Under O_DIRECT it reads the slot with Linux AIO (aio.go): every chunk of
// the slot (128 KiB or more) is submitted at once, and the caller sums
// each as soon as it and those before it arrived, so only the last chunk's
// sum follows the read, on the caller's own core. Without AIO, or when
// its few contexts are all in use, the first half (whole pages) is read
// and handed to the CRC helper goroutine, which sums it while the second
// half is read (crcsplit.go, readCRC). CRC-32C of 1 KiB or more folds 256
// bytes per step with AVX-512 carry-less multiplies where the CPU has
// them (crc32c.go, about twice hash/crc32's rate), else is hash/crc32's.
//
// Concurrency: a *Tablespace is safe for concurrent use by many goroutines.
// Put returns once the block is durable. Close must not race with other calls
// (calls after Close return ErrClosed). A WriteBehind is safe for concurrent
// Enqueue; its Close drains the queue. One process owns a path at a time
// (a second Open of the same path fails with ErrLocked).
package tablespace
