package kvcache

import "slices"

// Learning blocks whose parent predates the index (docs/architecture.md,
// "Joining a running fleet").
//
// A router hash chains from the parent's router hash, so a BlockStored whose
// parent engine hash the index never saw (stored before this router started
// following the engine, or lost in a resync) cannot be hashed and is
// dropped. But the engine only stores blocks of prompts it was sent, and the
// router sent them: when such an event's token ids continue a prompt this
// router routed to the worker at block j, the engine held that prompt's
// blocks 0..j-1 (it prefilled from block j on), the parent is the prompt's
// block j-1, and the event chains from the prompt's router hashes. The index
// then learns the parent's engine hash → router hash (so later events chained
// from it resolve too) and indexes the prefix blocks, whose own engine hashes
// stay unknown (they leave the index by LRU or a clear, not by a removal).
//
// The router keeps the last recentPrompts prompts per worker
// (NotePrompt); the search runs only for events with an unknown parent.

// recentPrompts is how many routed prompts a worker remembers for learning.
const recentPrompts = 8

// maxNoteTokens bounds the tokens one remembered prompt keeps (its head:
// learning needs the blocks up to the engine's cached prefix).
const maxNoteTokens = 1 << 15

// recentPrompt is one prompt routed to a worker: its tokens and its router
// block hashes for block size bs.
type recentPrompt struct {
	bs     int
	tokens []uint32
	hashes []uint64
}

// NotePrompt remembers a prompt just routed to w: its token ids and their
// router block hashes for block size bs (AppendBlockHashes). Warm calls do
// not allocate; the oldest remembered prompt's buffers are reused.
func (x *Index) NotePrompt(w *Worker, tokens []uint32, hashes []uint64, bs int) {
	if w == nil || w.idx != x || bs <= 0 || len(hashes) < 2 {
		return // a one-block prompt has no parent to learn
	}
	n := min(len(hashes), maxNoteTokens/bs, len(tokens)/bs)
	w.promptMu.Lock()
	p := &w.prompts[w.promptNext]
	w.promptNext = (w.promptNext + 1) % recentPrompts
	p.bs = bs
	p.tokens = append(p.tokens[:0], tokens[:n*bs]...)
	p.hashes = append(p.hashes[:0], hashes[:n]...)
	w.promptMu.Unlock()
}

// learnParentLocked finds the router hash of ev's unknown parent from the
// prompts routed to w (newest first): the prompt whose blocks from some
// j ≥ 1 on carry ev's tokens. It indexes the prompt's blocks 0..j-1, maps
// ev.Parent to block j-1 and returns that block's router hash.
func (x *Index) learnParentLocked(w *Worker, ev *Event, bs int, res *ApplyResult) (uint64, bool) {
	if bs <= 0 || len(ev.Tokens) < bs {
		return 0, false
	}
	w.promptMu.Lock()
	defer w.promptMu.Unlock()
	first := ev.Tokens[:bs]
	for k := range recentPrompts {
		p := &w.prompts[(w.promptNext-1-k+2*recentPrompts)%recentPrompts]
		if p.bs != bs {
			continue
		}
		nb := len(p.hashes)
		for j := 1; j < nb; j++ {
			if !slices.Equal(p.tokens[j*bs:(j+1)*bs], first) {
				continue
			}
			// The whole event, as far as the prompt goes, must continue it.
			m := min(len(ev.Hashes), nb-j)
			if !slices.Equal(p.tokens[j*bs:(j+m)*bs], ev.Tokens[:m*bs]) {
				continue
			}
			parent := p.hashes[j-1]
			// Leaf first, so the LRU order runs root … parent.
			for i := j - 1; i >= 0; i-- {
				if x.storeEngineLocked(w, p.hashes[i], ev.Parent, i == j-1) {
					res.Learned++
				}
			}
			return parent, true
		}
	}
	return 0, false
}
