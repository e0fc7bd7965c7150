package bench

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// WorkloadConversation is the conversation workload (conversationWorkload).
const WorkloadConversation = "conversation"

// conversationWorkload generates chat sessions whose shape follows published
// statistics of real conversation traces rather than any one file:
//
//   - Turns per session: 1 + a geometric number of follow-ups with mean
//     --turns (default 3 in `infera bench`'s conversation runs). LMSYS-Chat-1M
//     (Zheng et al., ICLR 2024, arXiv 2309.11998, table 1) reports 2.0 turns
//     per conversation on average, ShareGPT 3.5; both are long-tailed.
//   - Message lengths: lognormal (σ = 1, a long tail) with means --input-len
//     for user messages and --output-len for replies, in words. The same
//     table gives about 70 prompt and 215 response tokens per turn for
//     LMSYS-Chat-1M (95 and 349 for ShareGPT), so replies dominate the
//     growth of the resent conversation.
//   - Prompt growth: every turn resends the system prompt and the whole
//     conversation so far plus a new user message, as chat clients do.
//   - Prefix reuse across sessions: each session opens with one of
//     --prefix-groups system prompts of --prefix-len words, drawn with a
//     Zipf(1.1) popularity. The Mooncake trace (Qin et al., FAST 2025,
//     arXiv 2407.00079) shows most input blocks shared between requests,
//     mostly by a few popular prefixes; the mix of shared system prompts
//     and private histories is what makes a router's cache affinity matter.
//   - Burstiness: sessions start by a renewal process with Gamma
//     inter-arrival times of coefficient of variation 2 at --rate sessions
//     per second (default 2). BurstGPT (Wang et al., arXiv 2401.17644)
//     finds conversation request arrivals in Azure OpenAI GPT traffic
//     burstier than Poisson and fits them with Gamma distributions.
//   - Think time between a reply and the next user message: lognormal with
//     a median of 20 s (σ = 1), scaled by --trace-time-scale (1: real
//     time; 0.05 makes a bench run minutes, not hours; 0: none). This
//     one is an assumption: the sources above publish no think-time
//     distribution. A turn is sent at its scheduled time or when its
//     previous turn completes, whichever is later.
//
// The schedule is a pure function of the seed: building it draws from
// per-session generators (rngFor), never from shared state.
type conversationWorkload struct {
	seed      int64
	inputLen  int
	outputLen int
	prefixes  []string
	sched     []convTurn
	last      []chan struct{} // per session: its latest turn's completion
}

// convTurn is one scheduled request.
type convTurn struct {
	at      time.Duration
	session int
	turn    int
}

// Shape constants of the conversation workload (see the type's comment).
const (
	convArrivalCV    = 2.0
	convThinkMedian  = 20 * time.Second
	convLenSigma     = 1.0
	convZipfS        = 1.1
	convDefaultRate  = 2.0
	convMaxTurns     = 64
	convMaxRequests  = 1 << 17
	streamConvSched  = 0x40
	streamConvSystem = 0x41
)

// newConversationWorkload schedules n requests (convMaxRequests when n is
// 0: a --duration run stops at its end anyway).
func newConversationWorkload(seed int64, n, meanTurns, inputLen, outputLen, groups, prefixLen int, rate, scale float64) *conversationWorkload {
	if n <= 0 {
		n = convMaxRequests
	}
	if rate <= 0 {
		rate = convDefaultRate
	}
	w := &conversationWorkload{seed: seed, inputLen: inputLen, outputLen: outputLen}
	w.prefixes = make([]string, groups)
	for g := range groups {
		w.prefixes[g] = groupPrefix(seed, g, groups, prefixLen)
	}
	// Gamma inter-arrival with shape k = 1/CV² and mean 1/rate.
	k := 1 / (convArrivalCV * convArrivalCV)
	arr := rngFor(seed, streamConvSched, 0)
	var start float64
	cut := math.Inf(1)
	for s := 0; ; s++ {
		start += gammaDraw(arr, k) / (k * rate)
		if len(w.sched) >= n {
			if math.IsInf(cut, 1) {
				slices.SortStableFunc(w.sched, byAt)
				cut = w.sched[n-1].at.Seconds()
			}
			if start > cut {
				break
			}
		}
		r := rngFor(seed, streamConvSched, uint64(s)+1)
		turns := 1
		if meanTurns > 1 {
			// Follow-ups: geometric with mean meanTurns−1.
			p := 1 / float64(meanTurns)
			for turns < convMaxTurns && r.Float64() >= p {
				turns++
			}
		}
		at := start
		for t := range turns {
			if t > 0 {
				at += scale * convThinkMedian.Seconds() * math.Exp(convLenSigma*r.NormFloat64())
			}
			w.sched = append(w.sched, convTurn{at: time.Duration(at * float64(time.Second)), session: s, turn: t})
		}
	}
	slices.SortStableFunc(w.sched, byAt)
	w.sched = w.sched[:n]
	sessions := 0
	for _, c := range w.sched {
		sessions = max(sessions, c.session+1)
	}
	w.last = make([]chan struct{}, sessions)
	return w
}

func byAt(a, b convTurn) int {
	switch {
	case a.at < b.at:
		return -1
	case a.at > b.at:
		return 1
	}
	return 0
}

// gammaDraw draws Gamma(k, 1) (Marsaglia and Tsang; k < 1 by boosting).
func gammaDraw(r *rand.Rand, k float64) float64 {
	if k < 1 {
		return gammaDraw(r, k+1) * math.Pow(r.Float64(), 1/k)
	}
	d := k - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := r.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := r.Float64()
		if math.Log(u) < 0.5*x*x+d-d*v+d*math.Log(v) {
			return d * v
		}
	}
}

// lognormalLen draws a length of the given mean with a lognormal tail.
func lognormalLen(r *rand.Rand, mean int) int {
	mu := math.Log(float64(mean)) - convLenSigma*convLenSigma/2
	return max(1, min(int(math.Round(math.Exp(mu+convLenSigma*r.NormFloat64()))), 20*mean))
}

func (w *conversationWorkload) next(i int) (item, bool) {
	if i >= len(w.sched) {
		return item{}, false
	}
	c := w.sched[i]
	it := item{index: i, at: c.at, done: make(chan struct{})}
	if c.turn > 0 {
		it.after = w.last[c.session]
	}
	w.last[c.session] = it.done
	return it, true
}

func (w *conversationWorkload) build(it *item) {
	c := w.sched[it.index]
	sys := rngFor(w.seed, streamConvSystem, uint64(c.session))
	g := zipfIndex(sys, len(w.prefixes))
	msgs := make([]message, 0, 2*c.turn+2)
	msgs = append(msgs, message{role: "system", content: w.prefixes[g]})
	total := len(w.prefixes[g]) / 6
	out := w.outputLen
	for t := 0; t <= c.turn; t++ {
		idx := uint64(c.session)<<16 | uint64(t)
		ru := rngFor(w.seed, streamUser, idx)
		n := lognormalLen(ru, w.inputLen)
		msgs = append(msgs, message{role: "user", content: words(ru, n)})
		total += n
		ra := rngFor(w.seed, streamAssistant, idx)
		m := lognormalLen(ra, w.outputLen)
		if t == c.turn {
			out = m
			break
		}
		msgs = append(msgs, message{role: "assistant", content: words(ra, m)})
		total += m
	}
	it.messages, it.maxTokens, it.words = msgs, out, total
}

// zipfIndex draws 0..n-1 with probability ∝ 1/(i+1)^convZipfS.
func zipfIndex(r *rand.Rand, n int) int {
	if n <= 1 {
		return 0
	}
	sum := 0.0
	for i := range n {
		sum += math.Pow(float64(i+1), -convZipfS)
	}
	u := r.Float64() * sum
	for i := range n {
		u -= math.Pow(float64(i+1), -convZipfS)
		if u <= 0 {
			return i
		}
	}
	return n - 1
}
