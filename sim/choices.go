package sim

// Several choices (the OpenAI "n" parameter), as vLLM serves them: a
// request with n > 1 becomes n sequences of the same prompt, scheduled like
// n requests (each holds a batch slot, its blocks and one decode per step,
// so the step time counts n decoding sequences), whose outputs are rendered
// as choices 0..n-1 of one answer. Choice i's text is generated with the
// seed mixed with i (choice 0 keeps the plain seed, so n=1 answers are
// unchanged), so the choices differ but each is deterministic. Stop strings
// and max_tokens apply to every choice on its own, each with its own
// finish_reason; usage counts the prompt once and the completion tokens of
// every choice. Streamed, the chunks of the choices are interleaved, one
// token of each choice in turn, each chunk carrying its choice's index.

// MaxChoices is the largest n the simulator accepts; a larger n is
// answered with 400, as an engine rejects a request it cannot schedule.
const MaxChoices = 128

// choiceSeed is the generation seed of choice i.
func choiceSeed(seed uint64, i int) uint64 {
	return seed + uint64(i)*0x9e3779b97f4a7c15
}

// numChoices is how many choices q (a first choice) answers.
func (q *seq) numChoices() int { return 1 + len(q.more) }

// choice returns choice i of the answer whose first choice is q.
func (q *seq) choice(i int) *seq {
	if i == 0 {
		return q
	}
	return q.more[i-1]
}

// completionTokens is the sum of the completion tokens of every choice.
func (q *seq) completionTokens() int {
	n := q.maxTokens
	for _, c := range q.more {
		n += c.maxTokens
	}
	return n
}

// addChoices adds choices 1..n-1 to the prepared first choice q: the same
// prompt, maxTokens output tokens at most (before stop strings cut them),
// generated with their own seeds. They share q's wake-up channel, so a
// stream waiting on it sees the progress of every choice.
func (s *Server) addChoices(q *seq, n, maxTokens int, body []byte, stop span) {
	for i := 1; i < n; i++ {
		c := getSeq()
		c.notify = q.notify
		c.tokens = append(c.tokens[:0], q.tokens[:q.promptLen]...)
		c.promptLen, c.maxTokens, c.stream = q.promptLen, maxTokens, q.stream
		c.tool = append(c.tool[:0], q.tool...)
		prepareSeq(c, s.cfg.BlockSize, choiceSeed(s.seed, i), s.hf, body, stop)
		q.more = append(q.more, c)
	}
}

// putChoices recycles every choice of q, q last (it holds the others).
func putChoices(q *seq) {
	for _, c := range q.more {
		putSeq(c)
	}
	putSeq(q)
}

// submitChoices hands every choice of q to the scheduler; false when it
// has stopped. Choices already submitted then belong to the stopped
// scheduler (abandoned); the rest are recycled here.
func (sc *scheduler) submitChoices(q *seq) bool {
	if !sc.submit(q) {
		putChoices(q)
		return false
	}
	for i, c := range q.more {
		if !sc.submit(c) {
			for _, rest := range q.more[i:] {
				putSeq(rest)
			}
			return false
		}
	}
	return true
}

// waitChoicesOr waits until every choice of q finished (seqFinished), the
// scheduler stopped (seqShutdown) or gone closed (seqRunning: the caller
// aborts the choices with abortChoices).
func (sc *scheduler) waitChoicesOr(q *seq, gone <-chan struct{}) uint32 {
	for i := range q.numChoices() {
		if st := sc.waitOr(q.choice(i), gone); st != seqFinished {
			return st
		}
	}
	return seqFinished
}

// abortChoices gives back every choice of a request whose client left:
// finished ones are recycled, unfinished ones aborted (the scheduler frees
// their slots and recycles them); the first choice last, as it holds the
// others.
func (sc *scheduler) abortChoices(q *seq) {
	for i := q.numChoices() - 1; i >= 0; i-- {
		c := q.choice(i)
		switch c.done.Load() {
		case seqFinished:
			putSeq(c)
		case seqRunning:
			sc.abort(c)
		}
	}
}
