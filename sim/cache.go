package sim

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// rootHash is the parent of a sequence's first block. Any constant works;
// it only has to be the same for every sequence of this process.
const rootHash uint64 = 0x9e3779b97f4a7c15

// appendBlockHashes appends the chained hashes of the full blocks of tokens
// that dst does not cover yet: block i hashes (hash of block i-1, its token
// ids), so a block's hash names the whole prefix that ends with it, as in
// vLLM. scratch is reused space for the hashed bytes and is returned.
func appendBlockHashes(dst []uint64, tokens []uint32, blockSize int, scratch []byte) ([]uint64, []byte) {
	parent := rootHash
	if len(dst) > 0 {
		parent = dst[len(dst)-1]
	}
	for i := len(dst) * blockSize; i+blockSize <= len(tokens); i += blockSize {
		parent, scratch = hashTokens(parent, tokens[i:i+blockSize], scratch)
		dst = append(dst, parent)
	}
	return dst, scratch
}

// hashTokens hashes a parent hash and token ids (little-endian uint32).
func hashTokens(parent uint64, tokens []uint32, scratch []byte) (uint64, []byte) {
	scratch = binary.LittleEndian.AppendUint64(scratch[:0], parent)
	for _, t := range tokens {
		scratch = binary.LittleEndian.AppendUint32(scratch, t)
	}
	return xxhash.Sum64(scratch), scratch
}

// cacheObserver is told about every change to the set of cached blocks, in
// order, on the scheduler goroutine; it must not block. It is the hook for
// publishing KV events (BlockStored / BlockRemoved / AllBlocksCleared, see
// kvevents.go). blockStored's parent is rootHash for a sequence's first
// block; tokens is only valid during the call.
type cacheObserver interface {
	blockStored(hash, parent uint64, tokens []uint32)
	blockRemoved(hash uint64)
	allCleared()
}

// block is one KV-cache page.
type block struct {
	hash       uint64
	hashed     bool  // hash is registered in the cache's index
	ref        int32 // running sequences using the block
	prev, next int32 // free-queue links, noBlock when absent
	free       bool
}

const noBlock int32 = -1

// prefixCache is a paged KV cache with prefix sharing, modelled on vLLM's
// block pool: a fixed array of blocks, an index from block hash to block,
// and a free queue of unreferenced blocks ordered by eviction priority
// (head first). A freed block keeps its hash, so it can still be hit until
// it is reused; reusing it evicts the hash. It is owned by the scheduler
// goroutine and not safe for concurrent use.
type prefixCache struct {
	blockSize int
	blocks    []block
	index     map[uint64]int32

	freeHead, freeTail int32
	freeLen            int

	obs cacheObserver
}

func newPrefixCache(numBlocks, blockSize int, obs cacheObserver) *prefixCache {
	c := &prefixCache{
		blockSize: blockSize,
		blocks:    make([]block, numBlocks),
		index:     make(map[uint64]int32, numBlocks),
		freeHead:  noBlock,
		freeTail:  noBlock,
		obs:       obs,
	}
	for i := range c.blocks {
		c.blocks[i].prev, c.blocks[i].next = noBlock, noBlock
		c.pushTail(int32(i))
	}
	return c
}

// usage is the fraction of blocks referenced by running sequences, as
// vllm:kv_cache_usage_perc reports it (cached but free blocks count as free).
func (c *prefixCache) usage() float64 {
	return 1 - float64(c.freeLen)/float64(len(c.blocks))
}

// lookup returns the block that holds hash, if cached.
func (c *prefixCache) lookup(hash uint64) (int32, bool) {
	id, ok := c.index[hash]
	return id, ok
}

// acquire takes a reference on a cached block, taking it off the free queue.
func (c *prefixCache) acquire(id int32) {
	b := &c.blocks[id]
	if b.ref == 0 {
		c.unlink(id)
	}
	b.ref++
}

// allocate takes the free queue's head for new content, evicting its old
// hash. The caller has checked that the queue is not empty.
func (c *prefixCache) allocate() int32 {
	id := c.freeHead
	c.unlink(id)
	b := &c.blocks[id]
	if b.hashed {
		c.forget(id)
	}
	b.ref = 1
	return id
}

// commit registers a full block's hash. When another sequence already
// cached the same content, this copy stays anonymous and is reused first.
func (c *prefixCache) commit(id int32, hash, parent uint64, tokens []uint32) {
	if _, dup := c.index[hash]; dup {
		return
	}
	b := &c.blocks[id]
	b.hash, b.hashed = hash, true
	c.index[hash] = id
	if c.obs != nil {
		c.obs.blockStored(hash, parent, tokens)
	}
}

// release drops one reference on each block of a sequence. Blocks are freed
// from the sequence's end backwards so that a prefix's tail is evicted
// before its head (its head is the part most likely shared); blocks without
// a hash hold nothing reusable and go to the front of the queue.
func (c *prefixCache) release(ids []int32) {
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		b := &c.blocks[id]
		if b.ref--; b.ref > 0 {
			continue
		}
		if b.hashed {
			c.pushTail(id)
		} else {
			c.pushHead(id)
		}
	}
}

// reset forgets every cached hash (POST /reset_prefix_cache). Blocks in use
// keep their contents for their sequences but can no longer be shared.
func (c *prefixCache) reset() {
	for id := range c.blocks {
		c.blocks[id].hashed = false
	}
	clear(c.index)
	if c.obs != nil {
		c.obs.allCleared()
	}
}

func (c *prefixCache) forget(id int32) {
	b := &c.blocks[id]
	b.hashed = false
	if c.index[b.hash] == id {
		delete(c.index, b.hash)
		if c.obs != nil {
			c.obs.blockRemoved(b.hash)
		}
	}
}

func (c *prefixCache) pushTail(id int32) {
	b := &c.blocks[id]
	b.prev, b.next, b.free = c.freeTail, noBlock, true
	if c.freeTail != noBlock {
		c.blocks[c.freeTail].next = id
	} else {
		c.freeHead = id
	}
	c.freeTail = id
	c.freeLen++
}

func (c *prefixCache) pushHead(id int32) {
	b := &c.blocks[id]
	b.prev, b.next, b.free = noBlock, c.freeHead, true
	if c.freeHead != noBlock {
		c.blocks[c.freeHead].prev = id
	} else {
		c.freeTail = id
	}
	c.freeHead = id
	c.freeLen++
}

func (c *prefixCache) unlink(id int32) {
	b := &c.blocks[id]
	if b.prev != noBlock {
		c.blocks[b.prev].next = b.next
	} else {
		c.freeHead = b.next
	}
	if b.next != noBlock {
		c.blocks[b.next].prev = b.prev
	} else {
		c.freeTail = b.prev
	}
	b.prev, b.next, b.free = noBlock, noBlock, false
	c.freeLen--
}

// teeObserver returns an observer that tells a and then b; either may be
// nil.
func teeObserver(a, b cacheObserver) cacheObserver {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return tee{a, b}
}

type tee [2]cacheObserver

func (t tee) blockStored(hash, parent uint64, tokens []uint32) {
	t[0].blockStored(hash, parent, tokens)
	t[1].blockStored(hash, parent, tokens)
}

func (t tee) blockRemoved(hash uint64) {
	t[0].blockRemoved(hash)
	t[1].blockRemoved(hash)
}

func (t tee) allCleared() {
	t[0].allCleared()
	t[1].allCleared()
}
