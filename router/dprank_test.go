package router_test

import (
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/infera/infera/config"
	"github.com/infera/infera/discovery"
	"github.com/infera/infera/router"
)

func ranksSeen(u *upstream) []string {
	var out []string
	for _, r := range u.seen() {
		out = append(out, r.Headers["X-Data-Parallel-Rank"])
	}
	return out
}

// Under every policy, a rank-multiplexed worker (dp_size > 1, no dp_rank)
// gets each request pinned to one of its ranks with X-Data-Parallel-Rank, in
// turn, as Infera pins them; round-robin counts it as dp_size targets. A
// worker that is one external rank, or has dp_size 1, is never pinned.
func TestDPRankPinning(t *testing.T) {
	for _, policy := range []router.Policy{router.RoundRobin{}, router.LeastLoad{}} {
		t.Run(policy.Name(), func(t *testing.T) {
			mux, ext := jsonUpstream(t), jsonUpstream(t)
			muxRec := record(mux, "m", discovery.StatusActive)
			muxRec.Engine, muxRec.DPSize = discovery.EngineSGLang, 4
			tr := startRouter(t, policy, router.DefaultConfig(), muxRec)
			for range 8 {
				if resp, body := tr.chat(t, "m"); resp.StatusCode != http.StatusOK {
					t.Fatalf("%d %s", resp.StatusCode, body)
				}
			}
			if got, want := ranksSeen(mux), []string{"0", "1", "2", "3", "0", "1", "2", "3"}; !slices.Equal(got, want) {
				t.Fatalf("ranks received %q, want %q", got, want)
			}

			// Beside an external-rank worker: that one is never pinned.
			extRec := record(ext, "m", discovery.StatusActive)
			rank := 1
			extRec.DPRank, extRec.DPSize = &rank, 2
			tr.UpdateFleet(&discovery.Snapshot{Revision: 2, Workers: sortedRecords(muxRec, extRec)})
			for range 10 {
				if resp, body := tr.chat(t, "m"); resp.StatusCode != http.StatusOK {
					t.Fatalf("%d %s", resp.StatusCode, body)
				}
			}
			for _, r := range ranksSeen(ext) {
				if r != "" {
					t.Fatalf("external-rank worker got X-Data-Parallel-Rank %q", r)
				}
			}
			counts := map[string]int{}
			for _, r := range ranksSeen(mux)[8:] {
				counts[r]++
			}
			if policy.Name() == router.PolicyRoundRobin {
				// 5 targets, 10 requests: each rank twice, the other worker twice.
				if len(ext.seen()) != 2 || len(counts) != 4 {
					t.Fatalf("round-robin: external got %d, multiplexed ranks %v", len(ext.seen()), counts)
				}
				for r := range 4 {
					if counts[strconv.Itoa(r)] != 2 {
						t.Fatalf("round-robin: rank counts %v, want 2 each", counts)
					}
				}
			}
			for r := range counts {
				if n, err := strconv.Atoi(r); err != nil || n < 0 || n > 3 {
					t.Fatalf("rank %q out of 0..3", r)
				}
			}
		})
	}
}

func sortedRecords(recs ...discovery.Record) []discovery.Record {
	slices.SortFunc(recs, func(a, b discovery.Record) int {
		if a.WorkerID < b.WorkerID {
			return -1
		}
		if a.WorkerID > b.WorkerID {
			return 1
		}
		return 0
	})
	return recs
}

// simDPRanks reads the simulator's per-rank request counts
// (infera_sim_dp_rank_requests_total) from its /metrics.
func simDPRanks(t *testing.T, u *upstream) map[string]int {
	t.Helper()
	resp, err := http.Get("http://" + u.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for line := range strings.SplitSeq(string(body), "\n") {
		if !strings.HasPrefix(line, "infera_sim_dp_rank_requests_total{") {
			continue
		}
		_, rest, ok := strings.Cut(line, `dp_rank="`)
		rank, rest, ok2 := strings.Cut(rest, `"`)
		v, err := strconv.ParseFloat(rest[strings.LastIndexByte(rest, ' ')+1:], 64)
		if !ok || !ok2 || err != nil {
			t.Fatalf("metric line %q", line)
		}
		out[rank] = int(v)
	}
	return out
}

// Round-robin over a rank-multiplexed SGLang-flavor simulator (dp_size 4)
// pins the requests to ranks 0, 1, 2, 3, 0, … as the engine receives them.
func TestDPRankPinningAtSimulator(t *testing.T) {
	s := startSim(t, func(c *config.Sim) { c.Flavor = config.FlavorSGLang })
	rec := simRecord(s)
	rec.Engine, rec.DPSize = discovery.EngineSGLang, 4
	tr := startRouter(t, router.RoundRobin{}, router.DefaultConfig(), rec)
	want := map[string]int{}
	for i := range 9 {
		if resp, body := tr.chat(t, "sim-model"); resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		want[strconv.Itoa(i%4)]++
		if got := simDPRanks(t, s); !maps.Equal(got, want) {
			t.Fatalf("after request %d the simulator counted ranks %v, want %v", i, got, want)
		}
	}
}
