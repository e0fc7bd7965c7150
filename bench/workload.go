package bench

import (
	"math"
	"math/rand/v2"
	"strings"
	"time"
)

// vocabulary holds common lowercase English words, each a single token after
// a space in the BPE vocabularies of current models. Prompts are these words
// joined by single spaces: a BPE pre-tokenizer splits at exactly those spaces
// and a bytes tokenizer sees the same bytes, so two prompts with the same
// leading words share the same leading tokens under either, and a prefix
// always ends on a token boundary.
var vocabulary = strings.Fields(`
the of and to in is was for that with as on by at from his her they this
had not are but have one which were all she there been their when who will
more would can time no if out so said what up its about into than them some
could only other new then do first any my now such like our over man me even
most made after also did many before must through back years where much your
way well down should because each just those people how too little state good
very make world still own see men work long get here between both life being
under never day same another know while last might us great old year off come
since against go came right used take three states himself few house use during
without again place around however home small found thought went say part once
general high upon school every does got united left number course war until
always away something fact though water less public put think almost hand
enough far took head yet government system better set told nothing night end
why called eyes find going look asked later knew point next program city
business give group toward young days let room president side social given
present several order national possible rather second face per among form
important often things looking early white case john become large big need
four within felt along children saw best church ever least power development
light thing seemed family interest want members mind country area others done
turned although open god service certain kind problem began different door
thus help sense means whole matter perhaps itself york times law human line
above name example action company hands local show whether five history gave
today either act feet across taken past quite anything seen having death week
experience job field really money themselves particular body free half`)

// item is one request to send: its messages (one user message unless the
// workload is multi-turn), the output budget and, for a timed trace, when to
// send it relative to the start of the run.
type item struct {
	index     int
	messages  []message
	maxTokens int
	// words is the prompt length in words, the nominal input token count used
	// when the server reports no usage.
	words int
	// at is the arrival offset from the start of the run; negative when the
	// workload has no timestamps of its own.
	at time.Duration
	// after, when not nil, is closed once the request this one depends on (the
	// previous turn of its session) has completed.
	after <-chan struct{}
	// done is closed when this request completes; nil when nothing waits on it.
	done chan struct{}
}

type message struct {
	role    string
	content string
}

// workload yields the requests of a run in order, in two steps so that
// building large prompts never holds up dispatching:
//   - next schedules request i (its arrival time and the request it waits
//     for). It is cheap and only ever called from one goroutine at a time,
//     with i counting up from 0; ok is false when the workload is exhausted
//     (only a trace ends on its own).
//   - build fills in the messages and lengths of a scheduled request. It is a
//     pure function of the seed and it.index, safe for concurrent use.
type workload interface {
	next(i int) (it item, ok bool)
	build(it *item)
}

// Stream constants keep the random streams of the different prompt parts
// apart, so that e.g. group prefixes never equal request suffixes.
const (
	streamRandom uint64 = iota + 1
	streamPrefix
	streamSuffix
	streamUser
	streamAssistant
	streamBlock
	streamTracePad
)

// rngFor returns the generator of one prompt part: a pure function of the
// seed, the stream and an index, so a prompt never depends on the order in
// which others were generated.
func rngFor(seed int64, stream, index uint64) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(seed)^(stream<<56), index))
}

// appendWords appends n vocabulary words drawn from r, separated by spaces.
func appendWords(b *strings.Builder, r *rand.Rand, n int) {
	for k := 0; k < n; k++ {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocabulary[r.IntN(len(vocabulary))])
	}
}

func words(r *rand.Rand, n int) string {
	var b strings.Builder
	b.Grow(n * 7)
	appendWords(&b, r, n)
	return b.String()
}

// spreadLen draws a length uniformly from [n(1-spread), n(1+spread)], at least 1.
func spreadLen(r *rand.Rand, n int, spread float64) int {
	if spread <= 0 {
		return n
	}
	lo := float64(n) * (1 - spread)
	hi := float64(n) * (1 + spread)
	v := int(math.Round(lo + r.Float64()*(hi-lo)))
	return max(v, 1)
}

// randomWorkload sends independent prompts of --input-len words.
type randomWorkload struct {
	seed      int64
	inputLen  int
	outputLen int
	spread    float64
}

func (w *randomWorkload) next(i int) (item, bool) {
	return item{index: i, at: -1}, true
}

func (w *randomWorkload) build(it *item) {
	r := rngFor(w.seed, streamRandom, uint64(it.index))
	in := spreadLen(r, w.inputLen, w.spread)
	it.maxTokens = spreadLen(r, w.outputLen, w.spread)
	it.words = in
	it.messages = []message{{role: "user", content: words(r, in)}}
}

// sharedPrefixWorkload sends prompts made of one of G group prefixes followed
// by a per-request suffix. Every prompt of a group starts with the group's
// exact prefix text followed by a space.
type sharedPrefixWorkload struct {
	seed      int64
	prefixes  []string
	prefixLen int
	suffixLen int
	outputLen int
	spread    float64
}

func newSharedPrefixWorkload(seed int64, groups, prefixLen, suffixLen, outputLen int, spread float64) *sharedPrefixWorkload {
	w := &sharedPrefixWorkload{seed: seed, prefixLen: prefixLen, suffixLen: suffixLen, outputLen: outputLen, spread: spread}
	w.prefixes = make([]string, groups)
	for g := range groups {
		w.prefixes[g] = groupPrefix(seed, g, groups, prefixLen)
	}
	return w
}

// groupPrefix builds group g's prefix. Its first words spell g in base
// len(vocabulary) with as many digits as the largest group needs, so two groups
// differ within their first tokens and never share a cached block by chance.
func groupPrefix(seed int64, g, groups, n int) string {
	digits := 1
	for span := len(vocabulary); span < groups; span *= len(vocabulary) {
		digits++
	}
	digits = min(digits, n)
	var b strings.Builder
	b.Grow(n * 7)
	v := g
	for k := 0; k < digits; k++ {
		if k > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocabulary[v%len(vocabulary)])
		v /= len(vocabulary)
	}
	appendWords(&b, rngFor(seed, streamPrefix, uint64(g)), n-digits)
	return b.String()
}

func (w *sharedPrefixWorkload) group(i int) (int, *rand.Rand) {
	r := rngFor(w.seed, streamSuffix, uint64(i))
	return r.IntN(len(w.prefixes)), r
}

func (w *sharedPrefixWorkload) next(i int) (item, bool) {
	return item{index: i, at: -1}, true
}

func (w *sharedPrefixWorkload) build(it *item) {
	g, r := w.group(it.index)
	suffix := 0
	if w.suffixLen > 0 {
		suffix = spreadLen(r, w.suffixLen, w.spread)
	}
	it.maxTokens = spreadLen(r, w.outputLen, w.spread)
	it.words = w.prefixLen + suffix
	var b strings.Builder
	b.Grow(len(w.prefixes[g]) + suffix*7)
	b.WriteString(w.prefixes[g])
	appendWords(&b, r, suffix)
	it.messages = []message{{role: "user", content: b.String()}}
}

// multiTurnWorkload runs S sessions of T turns; turn t resends the whole
// conversation so far (user and assistant messages) plus a new user message,
// so each turn's prompt extends the previous one. Requests interleave the
// sessions (turn 0 of every session, then turn 1, ...) and a turn is not sent
// before its session's previous turn has completed. When all sessions are
// done, a fresh set of sessions starts, so --duration runs are not cut short.
type multiTurnWorkload struct {
	seed      int64
	sessions  int
	turns     int
	inputLen  int
	outputLen int
	spread    float64
	// last[s] is the completion signal of the latest request of session slot s.
	last []chan struct{}
}

func (w *multiTurnWorkload) next(i int) (item, bool) {
	slot := i % w.sessions
	turn := (i / w.sessions) % w.turns
	it := item{index: i, at: -1, done: make(chan struct{})}
	if turn > 0 {
		it.after = w.last[slot]
	}
	w.last[slot] = it.done
	return it, true
}

func (w *multiTurnWorkload) build(it *item) {
	i := it.index
	round := i / (w.sessions * w.turns)
	slot := i % w.sessions
	turn := (i / w.sessions) % w.turns
	session := uint64(round*w.sessions + slot)
	msgs := make([]message, 0, 2*turn+1)
	total := 0
	out := w.outputLen
	for t := 0; t <= turn; t++ {
		idx := session<<16 | uint64(t)
		ru := rngFor(w.seed, streamUser, idx)
		n := spreadLen(ru, w.inputLen, w.spread)
		msgs = append(msgs, message{role: "user", content: words(ru, n)})
		total += n
		ra := rngFor(w.seed, streamAssistant, idx)
		m := spreadLen(ra, w.outputLen, w.spread)
		if t == turn {
			out = m
			break
		}
		// The assistant's reply is synthetic, not what the server said, so the
		// conversation (and the prefix it shares with the next turn) stays a
		// pure function of the seed.
		msgs = append(msgs, message{role: "assistant", content: words(ra, m)})
		total += m
	}
	it.messages, it.maxTokens, it.words = msgs, out, total
}

// traceWorkload replays a Mooncake trace: each record's prompt is the
// concatenation of the blocks named by its hash ids, where a hash id always
// maps to the same blockWords words, so equal ids give equal text; the last
// block is cut to the record's input length.
type traceWorkload struct {
	seed       int64
	records    []TraceRecord
	timeScale  float64
	blockWords int // words per hash id; 0 means traceBlockTokens
}

// traceBlockTokens is the size of a trace block: Mooncake hash ids name 512-token blocks.
const traceBlockTokens = 512

func (w *traceWorkload) next(i int) (item, bool) {
	if i >= len(w.records) {
		return item{}, false
	}
	at := time.Duration(-1)
	if w.timeScale > 0 {
		at = time.Duration(float64(w.records[i].Timestamp) * w.timeScale * float64(time.Millisecond))
	}
	return item{index: i, at: at}, true
}

func (w *traceWorkload) build(it *item) {
	rec := w.records[it.index]
	blockWords := w.blockWords
	if blockWords <= 0 {
		blockWords = traceBlockTokens
	}
	// Scale the input length with the block size, rounding up so that a
	// record keeps at least one word per started block.
	inputWords := (rec.InputLength*blockWords + traceBlockTokens - 1) / traceBlockTokens
	var b strings.Builder
	b.Grow(inputWords * 7)
	left := inputWords
	for _, h := range rec.HashIDs {
		if left <= 0 {
			break
		}
		n := min(left, blockWords)
		// Drawing the block's words in order means a cut block is a prefix of
		// the full block, as a partial block of the same tokens would be.
		appendWords(&b, rngFor(w.seed, streamBlock, uint64(h)), n)
		left -= n
	}
	if left > 0 {
		// The record is longer than its blocks: pad with text of its own.
		appendWords(&b, rngFor(w.seed, streamTracePad, uint64(it.index)), left)
	}
	it.messages = []message{{role: "user", content: b.String()}}
	it.maxTokens = max(rec.OutputLength, 1)
	it.words = inputWords
}

// renderPrompt flattens messages into one completions prompt. Joining with
// newlines keeps each turn's prompt a prefix of the next turn's.
func renderPrompt(msgs []message) string {
	if len(msgs) == 1 {
		return msgs[0].content
	}
	n := 0
	for _, m := range msgs {
		n += len(m.content) + 1
	}
	var b strings.Builder
	b.Grow(n)
	for k, m := range msgs {
		if k > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(m.content)
	}
	return b.String()
}
