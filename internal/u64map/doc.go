// Package u64map holds Map, the open-addressing hash table keyed by a
// uint64 hash that the hot paths counting prompt blocks share: kvcache's
// Placements (block hash → last placement) and the router's in-flight
// block counts (block hash → requests holding it). A Go map cost a quarter
// of a 512-worker pick there (issue 37).
//
// Concurrency: a Map is not safe for concurrent use; its owner's lock
// guards it.
package u64map
