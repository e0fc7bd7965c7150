package sim

import "strconv"

// Data-parallel rank accounting: the router pins a request to one rank of
// a rank-multiplexed engine with X-Data-Parallel-Rank (SGLang --dp-size,
// vLLM --data-parallel-size). The simulator runs every rank as one, but
// counts the requests per rank it was asked for, so that tests can see the
// pinning as the engine received it (infera_sim_dp_rank_requests_total in
// /metrics, a line per rank that got a request).

// maxDPRanks bounds the ranks counted; a header naming another rank, or
// that is not a decimal integer, is not counted.
const maxDPRanks = 64

// parseDPRank returns the rank an X-Data-Parallel-Rank value names, or
// false when v is not a decimal integer in [0, maxDPRanks).
func parseDPRank(v []byte) (int, bool) {
	if len(v) == 0 {
		return 0, false
	}
	n := 0
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		if n = n*10 + int(c-'0'); n >= maxDPRanks {
			return 0, false
		}
	}
	return n, true
}

// countDPRank counts one request for the rank its header names.
func (s *Server) countDPRank(v []byte) {
	if r, ok := parseDPRank(v); ok {
		s.dpRanks[r].Add(1)
	}
}

// appendDPRanks appends the per-rank request counter, for the ranks seen.
func (s *Server) appendDPRanks(b []byte) []byte {
	header := false
	for r := range s.dpRanks {
		n := s.dpRanks[r].Load()
		if n == 0 {
			continue
		}
		if !header {
			b = append(b, "# HELP infera_sim_dp_rank_requests_total Requests received per X-Data-Parallel-Rank.\n"+
				"# TYPE infera_sim_dp_rank_requests_total counter\n"...)
			header = true
		}
		b = append(b, "infera_sim_dp_rank_requests_total{"...)
		b = append(b, s.labels...)
		b = append(b, `,dp_rank="`...)
		b = strconv.AppendInt(b, int64(r), 10)
		b = append(b, "\"} "...)
		b = appendPromFloat(b, float64(n))
		b = append(b, '\n')
	}
	return b
}
