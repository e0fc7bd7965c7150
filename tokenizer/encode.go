package tokenizer

// maxLevels bounds the pre-tokenizer depth a tokenizer.json may declare;
// real files use two or four steps.
const maxLevels = 16

// scratch is per-call working memory, pooled so that encoding allocates
// nothing once warm.
type scratch struct {
	syms, ranks, ids []uint32
	prev, next       []int32
	alive            []bool
	heap             []mergeItem
	runes            []rune
	offs             []int
	l1               *[l1Words]l1Entry // bpe.appendWord's own word cache
}

type encodeState struct {
	sc     scratch
	spans  [maxLevels][]span
	pieces [maxLevels][]piece
}

// piece is a span after a split behaviour is applied.
type piece struct {
	span
	match bool
}

// Name returns the tokenizer's name (its directory's base name).
func (t *HF) Name() string { return t.name }

// VocabSize returns one past the largest token id.
func (t *HF) VocabSize() int { return t.vocabSize }

// Encode returns the token ids of text without adding special tokens. Added
// and special tokens that appear in text are matched as themselves, as
// Hugging Face tokenizers do.
func (t *HF) Encode(text string) []uint32 {
	return t.AppendEncode(make([]uint32, 0, len(text)/3+4), text)
}

// AppendEncode appends the ids of text to dst and returns it. It allocates
// nothing beyond growing dst once its caches are warm.
func (t *HF) AppendEncode(dst []uint32, text string) []uint32 {
	st := t.pool.Get().(*encodeState)
	dst = t.encodeRaw(dst, text, st)
	t.pool.Put(st)
	return dst
}

// encodeRaw splits out raw-matched added tokens, then normalizes and encodes
// the text between them.
func (t *HF) encodeRaw(dst []uint32, text string, st *encodeState) []uint32 {
	if t.rawAdded == nil {
		return t.encodeSegmentCached(dst, text, st)
	}
	pos := 0
	for pos < len(text) {
		start, end, id := t.rawAdded.next(text, pos, pos)
		if start < 0 {
			break
		}
		if start > pos {
			dst = t.encodeSegmentCached(dst, text[pos:start], st)
		}
		dst = append(dst, id)
		pos = end
	}
	if pos < len(text) {
		dst = t.encodeSegmentCached(dst, text[pos:], st)
	}
	return dst
}

func (t *HF) encodeSegment(dst []uint32, seg string, st *encodeState) []uint32 {
	if t.normalize != nil {
		seg = t.normalize(seg)
	}
	if t.normAdded == nil {
		return t.preTokenize(dst, 0, seg, st)
	}
	pos := 0
	for pos < len(seg) {
		start, end, id := t.normAdded.next(seg, pos, pos)
		if start < 0 {
			break
		}
		if start > pos {
			dst = t.preTokenize(dst, 0, seg[pos:start], st)
		}
		dst = append(dst, id)
		pos = end
	}
	if pos < len(seg) {
		dst = t.preTokenize(dst, 0, seg[pos:], st)
	}
	return dst
}

// preTokenize runs pre-tokenizer step level on s and everything after it on
// each resulting piece; past the last step, s is one word for the model.
func (t *HF) preTokenize(dst []uint32, level int, s string, st *encodeState) []uint32 {
	if s == "" {
		return dst
	}
	if level >= t.leaf {
		return t.model.appendWord(dst, s, &st.sc)
	}
	step := &t.steps[level]
	if step.addPrefixSpace && s[0] != ' ' {
		// Rare (no supported family sets it), so the copy is acceptable.
		s = " " + s
	}
	if step.split == nil {
		return t.preTokenize(dst, level+1, s, st)
	}
	if sc, ok := step.split.(scanner); ok && step.behavior == behaviorIsolated && !step.invert {
		// Fast path: stream matches and the gaps between them without
		// collecting spans; straight to the model when nothing below
		// splits.
		if level+1 >= t.leaf {
			return t.isolateWords(dst, s, sc, st)
		}
		pos := 0
		for i := 0; i < len(s); {
			end := sc(s, i)
			if end <= i {
				_, w := classAt(s, i)
				i += w
				continue
			}
			if i > pos {
				dst = t.preTokenize(dst, level+1, s[pos:i], st)
			}
			dst = t.preTokenize(dst, level+1, s[i:end], st)
			i, pos = end, end
		}
		if pos < len(s) {
			dst = t.preTokenize(dst, level+1, s[pos:], st)
		}
		return dst
	}
	spans := step.split.appendMatches(s, st.spans[level][:0], &st.sc)
	st.spans[level] = spans
	pieces := applyBehavior(st.pieces[level][:0], spans, len(s), step.behavior, step.invert)
	st.pieces[level] = pieces
	for _, p := range pieces {
		dst = t.preTokenize(dst, level+1, s[p.start:p.end], st)
	}
	return dst
}

// isolateWords is preTokenize's fast path at the last splitting step: the
// matches of sc and the gaps between them are the words.
func (t *HF) isolateWords(dst []uint32, s string, sc scanner, st *encodeState) []uint32 {
	pos := 0
	for i := 0; i < len(s); {
		end := sc(s, i)
		if end <= i {
			_, w := classAt(s, i)
			i += w
			continue
		}
		if i > pos {
			dst = t.model.appendWord(dst, s[pos:i], &st.sc)
		}
		dst = t.model.appendWord(dst, s[i:end], &st.sc)
		i, pos = end, end
	}
	if pos < len(s) {
		dst = t.model.appendWord(dst, s[pos:], &st.sc)
	}
	return dst
}

// applyBehavior turns matches into the pieces a Split keeps, following
// Hugging Face's SplitDelimiterBehavior (with invert swapping which spans
// count as matches).
func applyBehavior(out []piece, matches []span, n int, b splitBehavior, invert bool) []piece {
	all := out
	pos := 0
	for _, m := range matches {
		if m.start > pos {
			all = append(all, piece{span{pos, m.start}, invert})
		}
		all = append(all, piece{m, !invert})
		pos = m.end
	}
	if pos < n {
		all = append(all, piece{span{pos, n}, invert})
	}
	res := all[:0]
	prevMatch := false
	switch b {
	case behaviorIsolated:
		return all
	case behaviorRemoved:
		for _, p := range all {
			if !p.match {
				res = append(res, p)
			}
		}
	case behaviorMergedWithPrevious:
		for _, p := range all {
			if p.match && !prevMatch && len(res) > 0 {
				res[len(res)-1].end = p.end
			} else {
				res = append(res, p)
			}
			prevMatch = p.match
		}
	case behaviorMergedWithNext:
		// Walk backwards, extending the following piece over a match.
		w := len(all)
		for i := len(all) - 1; i >= 0; i-- {
			p := all[i]
			if p.match && !prevMatch && w < len(all) {
				all[w].start = p.start
			} else {
				w--
				all[w] = p
			}
			prevMatch = p.match
		}
		res = append(res, all[w:]...)
	case behaviorContiguous:
		first := true
		for _, p := range all {
			if !first && p.match == prevMatch {
				res[len(res)-1].end = p.end
			} else {
				res = append(res, p)
			}
			first = false
			prevMatch = p.match
		}
	}
	return res
}

// Decode returns the text of ids: byte-level tokens as their bytes, added
// tokens as their content.
func (t *HF) Decode(ids []uint32) (string, error) {
	n := 0
	for _, id := range ids {
		if int(id) >= len(t.idBytes) || t.idBytes[id] == nil {
			return "", ErrUnknownID
		}
		n += len(t.idBytes[id])
	}
	out := make([]byte, 0, n)
	for _, id := range ids {
		out = append(out, t.idBytes[id]...)
	}
	return string(out), nil
}
