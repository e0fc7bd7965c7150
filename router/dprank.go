package router

// Data-parallel rank pinning, as Infera does it: a rank-multiplexed worker
// (dp_size > 1 and no dp_rank: one endpoint in front of dp_size engine
// ranks, SGLang --dp-size) counts as dp_size targets, and the request is
// pinned to the chosen rank with X-Data-Parallel-Rank (honoured by SGLang
// and vLLM). A worker that is one rank of an external deployment (dp_rank
// set) or has dp_size 1 is one target and is not pinned.

// multiplexedRanks returns how many targets w is: its dp_size when it
// multiplexes ranks, else 1.
func multiplexedRanks(w *Worker) int {
	rec := w.Record()
	if rec == nil || rec.DPRank != nil {
		return 1
	}
	return rec.EffectiveDPSize()
}

// pickTarget returns the worker and rank of target i (0 ≤ i < total) of
// the expanded list, in candidate order, each multiplexed worker's ranks
// 0, 1, … in turn.
func pickTarget(ws []*Worker, i int) Ticket {
	for _, w := range ws {
		r := multiplexedRanks(w)
		if i < r {
			if r > 1 {
				return Ticket{Worker: w, PinRank: true, DPRank: i}
			}
			return Ticket{Worker: w}
		}
		i -= r
	}
	// Unreachable when i < the sum of the ranks: the record of a worker can
	// change between the two passes only through a new fleet view, which
	// builds new Candidates.
	return Ticket{Worker: ws[len(ws)-1]}
}

// totalTargets is the length of the expanded target list.
func totalTargets(ws []*Worker) int {
	n := 0
	for _, w := range ws {
		n += multiplexedRanks(w)
	}
	return n
}

// pinNextRank pins t to the next rank of its worker in turn, when the worker
// multiplexes ranks and the policy chose the worker only (least-load).
func pinNextRank(t *Ticket) {
	if t.PinRank {
		return
	}
	if r := multiplexedRanks(t.Worker); r > 1 {
		t.PinRank, t.DPRank = true, int(t.Worker.rankCursor.Add(1)-1)%r
	}
}
