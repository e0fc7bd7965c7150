package bench

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestPercentileHandComputed(t *testing.T) {
	// Hand-computed with rank = p/100·(n-1) and linear interpolation.
	cases := []struct {
		name   string
		sorted []float64
		p      float64
		want   float64
	}{
		{"empty", nil, 50, 0},
		{"single", []float64{7}, 99, 7},
		{"median of two", []float64{1, 3}, 50, 2},
		// n=4, p50 → rank 1.5 → 2 + 0.5·(3-2) = 2.5
		{"median of four", []float64{1, 2, 3, 4}, 50, 2.5},
		// n=5, p90 → rank 3.6 → 40 + 0.6·(50-40) = 46
		{"p90 of five", []float64{10, 20, 30, 40, 50}, 90, 46},
		// n=5, p99 → rank 3.96 → 40 + 0.96·10 = 49.6
		{"p99 of five", []float64{10, 20, 30, 40, 50}, 99, 49.6},
		// n=10 (1..10), p90 → rank 8.1 → 9 + 0.1 = 9.1
		{"p90 of ten", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 90, 9.1},
		// n=10, p99 → rank 8.91 → 9.91
		{"p99 of ten", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 99, 9.91},
		{"p0 is the minimum", []float64{1, 5, 9}, 0, 1},
		{"p100 is the maximum", []float64{1, 5, 9}, 100, 9},
		{"out of range clamps", []float64{1, 5, 9}, 150, 9},
		{"exact rank", []float64{1, 5, 9}, 50, 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percentile(tc.sorted, tc.p); math.Abs(got-tc.want) > 1e-9 {
				t.Fatalf("Percentile(%v, %v) = %v, want %v", tc.sorted, tc.p, got, tc.want)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	// Unsorted input: Summarize sorts it. Sorted: 1 2 3 4 100.
	s := Summarize([]float64{4, 100, 1, 3, 2})
	want := Summary{Mean: 22, P50: 3, P90: 4 + 0.6*96, P99: 4 + 0.96*96}
	if math.Abs(s.Mean-want.Mean) > 1e-9 || math.Abs(s.P50-want.P50) > 1e-9 ||
		math.Abs(s.P90-want.P90) > 1e-9 || math.Abs(s.P99-want.P99) > 1e-9 {
		t.Fatalf("Summarize = %+v, want %+v", s, want)
	}
	if (Summarize(nil) != Summary{}) {
		t.Fatal("Summarize(nil) is not zero")
	}
}

func TestCDF(t *testing.T) {
	got := CDF([]float64{1, 2, 2, 4})
	want := [][2]float64{{1, 0.25}, {2, 0.5}, {2, 0.75}, {4, 1}}
	if len(got) != len(want) {
		t.Fatalf("CDF = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("CDF[%d] = %v, want %v", i, got[i], want[i])
		}
	}
	big := make([]float64, 10*maxCDFPoints+3)
	for i := range big {
		big[i] = float64(i)
	}
	c := CDF(big)
	if len(c) != maxCDFPoints {
		t.Fatalf("CDF of %d samples has %d points, want %d", len(big), len(c), maxCDFPoints)
	}
	if c[0] != [2]float64{0, 1 / float64(len(big))} || c[len(c)-1] != [2]float64{float64(len(big) - 1), 1} {
		t.Fatalf("CDF ends = %v … %v, want the smallest and largest samples", c[0], c[len(c)-1])
	}
	for i := 1; i < len(c); i++ {
		if c[i][0] < c[i-1][0] || c[i][1] <= c[i-1][1] {
			t.Fatalf("CDF not monotone at %d: %v then %v", i, c[i-1], c[i])
		}
	}
	if len(CDF(nil)) != 0 {
		t.Fatal("CDF(nil) not empty")
	}
}

func TestPoissonGaps(t *testing.T) {
	// Deterministic: a fixed seed, no clock. For an exponential distribution
	// the standard deviation equals the mean, so the mean of n gaps has a
	// standard error of mean/√n; 5 standard errors leaves no room for flakes
	// while catching a wrong rate (even 2% off) or a non-exponential shape.
	const rate = 40.0
	const n = 200000
	p := &poissonGaps{rate: rate, r: rand.New(rand.NewPCG(7, 11))}
	sum, sumSq := 0.0, 0.0
	for range n {
		g := p.next()
		if g < 0 {
			t.Fatalf("negative gap %v", g)
		}
		sum += g
		sumSq += g * g
	}
	mean := sum / n
	wantMean := 1 / rate
	if se := wantMean / math.Sqrt(n); math.Abs(mean-wantMean) > 5*se {
		t.Fatalf("mean inter-arrival %v s, want %v ± %v", mean, wantMean, 5*se)
	}
	// Exponential: variance = mean².
	variance := sumSq/n - mean*mean
	if math.Abs(math.Sqrt(variance)/mean-1) > 0.02 {
		t.Fatalf("coefficient of variation %v, want 1 (exponential)", math.Sqrt(variance)/mean)
	}
	// Same seed, same arrivals.
	a := &poissonGaps{rate: rate, r: rand.New(rand.NewPCG(7, 11))}
	b := &poissonGaps{rate: rate, r: rand.New(rand.NewPCG(7, 11))}
	for range 100 {
		if a.next() != b.next() {
			t.Fatal("same seed gave different arrivals")
		}
	}
}

func TestPercentileInterval(t *testing.T) {
	one := make([]float64, 100) // 1..100: X(j) = j
	for i := range one {
		one[i] = float64(i + 1)
	}
	cases := []struct {
		name   string
		sorted []float64
		p      float64
		lo, hi float64
	}{
		{"empty", nil, 50, 0, 0},
		// np 10, 1.96·√9 = 5.88: ranks ⌊4.12⌋ and ⌈15.88⌉.
		{"p10 of 100", one, 10, 4, 16},
		// np 50, 1.96·5 = 9.8: ranks 40 and 60.
		{"p50 of 100", one, 50, 40, 60},
		// np 99, 1.96·√0.99 = 1.95: ranks 97 and ⌈100.95⌉ clamped to 100.
		{"p99 clamps", one, 99, 97, 100},
		{"single", []float64{7}, 50, 7, 7},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if lo, hi := PercentileInterval(tc.sorted, tc.p, 1.96); lo != tc.lo || hi != tc.hi {
				t.Fatalf("PercentileInterval(p%v) = [%v, %v], want [%v, %v]", tc.p, lo, hi, tc.lo, tc.hi)
			}
		})
	}
	// p10 of 1..100 is 10.9 (rank 9.9): the interval [4, 16] is 6.9 below it.
	if got, want := PercentileResolution(one, 10), 6.9/10.9; math.Abs(got-want) > 1e-12 {
		t.Fatalf("PercentileResolution(p10) = %v, want %v", got, want)
	}
}

// TestPercentileTolerance is the arithmetic of make bench-kv's check that
// kv-aware's percentile is no worse than round-robin's: ε is the larger of
// the reference's repeat-to-repeat spread and its percentile's resolution,
// and a run above the reference by more than ε still fails.
func TestPercentileTolerance(t *testing.T) {
	base := make([]float64, 100)
	for i := range base {
		base[i] = float64(i + 1)
	}
	scaled := make([]float64, 100)
	for i := range scaled {
		scaled[i] = 1.5 * base[i]
	}
	t.Run("repeats that agree: the resolution is the floor", func(t *testing.T) {
		eps, spread, floor := PercentileTolerance([][]float64{base, base, base}, 10)
		if spread != 0 || math.Abs(floor-6.9/10.9) > 1e-12 || eps != floor {
			t.Fatalf("ε %v, spread %v, floor %v: want spread 0 and ε the floor %v", eps, spread, floor, 6.9/10.9)
		}
	})
	t.Run("repeats apart: the spread", func(t *testing.T) {
		// p50: 50.5 and 75.75, 0.5 apart relatively; each resolves 10.5/50.5.
		eps, spread, floor := PercentileTolerance([][]float64{base, scaled}, 50)
		if math.Abs(spread-0.5) > 1e-12 || math.Abs(floor-10.5/50.5) > 1e-12 || eps != spread {
			t.Fatalf("ε %v, spread %v, floor %v: want ε the spread 0.5, floor %v", eps, spread, floor, 10.5/50.5)
		}
	})
	t.Run("the check can fail", func(t *testing.T) {
		// 1,000 samples 100.00…109.99: p10 100.999, interval [100.80, 101.18],
		// a resolution of 0.2 %. A run 1 % above it is worse.
		fine := make([]float64, 1000)
		for i := range fine {
			fine[i] = 100 + float64(i)*0.01
		}
		ref := Percentile(fine, 10)
		eps, _, _ := PercentileTolerance([][]float64{fine, fine, fine}, 10)
		if within := 1.01*ref <= ref*(1+eps); within || eps > 0.002 || eps < 0.0019 {
			t.Fatalf("ε %v: a percentile 1%% above the reference passed (or ε is not 0.197%%)", eps)
		}
		if !(1.001*ref <= ref*(1+eps)) {
			t.Fatalf("ε %v: a percentile 0.1%% above the reference failed", eps)
		}
	})
	if eps, spread, floor := PercentileTolerance(nil, 50); eps != 0 || spread != 0 || floor != 0 {
		t.Fatalf("no repeats: ε %v, spread %v, floor %v", eps, spread, floor)
	}
}
