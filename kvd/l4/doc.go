// Package l4 is kvd's distributed tier, shared by every host's daemon so
// that a prefix computed on one host is found by another: on Redis or
// Valkey (`infera kvd --l4-redis URL`, redis.go) or on Mooncake Store
// (`--long-backend mooncake`, mooncake.go over kvd/mcstore, the GPU
// build). Both are a Remote under one Tier, so write-behind, read-through,
// checksums and outages behave the same on either.
//
// Mooncake keys are the Tier's (prefix = cluster_id + ":", then model,
// compat_key and hex key, ':' and '%' escaped), not the Python fleet's
// (`cluster_id:model\0compat\0hex`): Mooncake's C API takes keys as C
// strings, which cannot hold the NUL bytes the reference puts in its keys,
// so a Go and a Python kvd cannot share objects in one Mooncake pool.
//
// A Tier is a kvd.LongStore placed below the store: over the optional L3
// tablespace (Options.Below) or right below RAM. It owns:
//   - write-behind: Put writes L3 synchronously (when there is one) and
//     queues the Redis write on a bounded queue; one writer pipelines the
//     queue in batches (SET with the TTL of long retention); a full queue
//     or a down Redis drops the write and counts it;
//   - read-through: Get on an L3 miss reads Redis within Options.Timeout;
//     the value carries a 4-byte magic and a CRC-32C checked on read (a
//     mismatch is a miss and the bad copy is deleted); a hit is returned
//     to the store, which promotes it into RAM, and is copied into L3 off
//     the read path;
//   - keys: Options.Prefix + model + ":" + compat_key + ":" + hex(key),
//     ':' and '%' in names percent-escaped;
//   - outages: the first failed call marks Redis down with one log line
//     (gauge infera_kvd_l4_up = 0); while down nothing waits on Redis (reads
//     miss, writes are dropped); a prober pings every 250 ms and marks it
//     up again with one log line.
//
// The client is github.com/redis/go-redis/v9: the Redis project's own Go
// client, the most used one, with standalone and cluster behind one
// UniversalClient, redis:// and rediss:// URL parsing (TLS, ACL user,
// password, db), pipelining and context deadlines.
//
// Concurrency: a Tier is safe for concurrent use; its writer, promoter
// and prober goroutines stop in Close, which first writes what is queued.
package l4
