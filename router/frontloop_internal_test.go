package router

import (
	"math/rand/v2"
	"testing"
)

// countPolls runs n turns of l's poll policy, each poll bringing a request
// with probability p (a seeded source: the same draws every run), and
// returns how many turns polled.
func countPolls(l *frontLoop, n int, p float64) int {
	rng := rand.New(rand.NewPCG(1, 2))
	polls := 0
	for range n {
		if l.turnPolls() {
			polls++
			l.scorePoll(rng.Float64() < p)
		}
	}
	return polls
}

// TestTurnPollsWhilePollsPay: a loop whose turns' polls keep finding
// nothing polls only one turn in pollProbe (each poll a system call for
// nothing); while most polls bring a request, nearly every turn polls.
func TestTurnPollsWhilePollsPay(t *testing.T) {
	var l frontLoop
	if got := countPolls(&l, 1600, 0); got != 1600/pollProbe {
		t.Fatalf("%d polls in 1600 turns finding nothing, want %d (one a probe)", got, 1600/pollProbe)
	}
	if got := countPolls(&l, 1600, 1); got < 1600-pollProbe {
		t.Fatalf("%d polls in 1600 turns each bringing a request, want every turn after the first probe", got)
	}
	// wrk -c64 in front of two simulators: 26 % of the polls brought a
	// request, below the break-even: the turns mostly skip.
	if got := countPolls(&l, 16000, 0.26); got > 16000/5 {
		t.Fatalf("%d polls in 16000 turns with 26 %% of the polls bringing a request, want ≤ 3200", got)
	}
	// Nine in ten, above it: the turns poll.
	if got := countPolls(&l, 16000, 0.9); got < 16000*9/10 {
		t.Fatalf("%d polls in 16000 turns with nine polls in ten bringing a request, want ≥ 14400", got)
	}
}
