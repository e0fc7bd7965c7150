package bench

import (
	"math"
	"slices"
)

// Summary is the distribution of one latency metric in milliseconds.
type Summary struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
}

// Percentile returns the p-th percentile (0..100) of sorted values by linear
// interpolation between the closest ranks (numpy's default, and what `vllm
// bench serve` reports): rank = p/100·(n-1). It returns 0 for no values.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	p = min(max(p, 0), 100)
	rank := p / 100 * float64(n-1)
	lo := int(math.Floor(rank))
	hi := int(math.Ceil(rank))
	if lo == hi {
		return sorted[lo]
	}
	return sorted[lo] + (sorted[hi]-sorted[lo])*(rank-float64(lo))
}

// PercentileInterval returns the distribution-free confidence interval of
// the p-th percentile (0..100) of sorted values at z standard errors: the
// order statistics X(j) and X(k), 1-based, with j = ⌊np − z√(np(1−p))⌋ and
// k = ⌈np + z√(np(1−p))⌉ (the number of samples below the true percentile
// is binomial; this is its normal approximation), clamped to the samples.
// It returns 0, 0 for no values.
func PercentileInterval(sorted []float64, p, z float64) (lo, hi float64) {
	n := len(sorted)
	if n == 0 {
		return 0, 0
	}
	q := min(max(p, 0), 100) / 100
	np, sd := float64(n)*q, z*math.Sqrt(float64(n)*q*(1-q))
	j := min(max(int(math.Floor(np-sd)), 1), n)
	k := min(max(int(math.Ceil(np+sd)), 1), n)
	return sorted[j-1], sorted[k-1]
}

// PercentileResolution is the relative half-width of the p-th percentile's
// 95% interval (PercentileInterval at z 1.96): the larger distance from the
// percentile to either end, over the percentile. Two runs' percentiles
// closer than this are not told apart by n samples. It returns 0 for no
// values or a zero percentile.
func PercentileResolution(sorted []float64, p float64) float64 {
	x := Percentile(sorted, p)
	if x == 0 {
		return 0
	}
	lo, hi := PercentileInterval(sorted, p, 1.96)
	return max(hi-x, x-lo) / math.Abs(x)
}

// PercentileTolerance is how far above a reference's p-th percentile
// another run's may lie and still count as no worse, from the reference's
// repeats (each sorted): ε is the larger of spread, the largest relative
// difference between two repeats' percentiles (how much the reference
// moves against itself), and floor, the median over the repeats of the
// percentile's resolution (PercentileResolution: what one repeat's n
// samples can tell apart). With few repeats that agree by chance (a
// percentile made of identical cold prefills) the spread alone is 0 and
// a check against it fails on any difference, however far below what
// the samples resolve.
func PercentileTolerance(repeats [][]float64, p float64) (eps, spread, floor float64) {
	res := make([]float64, 0, len(repeats))
	for i, a := range repeats {
		res = append(res, PercentileResolution(a, p))
		for _, b := range repeats[i+1:] {
			x, y := Percentile(a, p), Percentile(b, p)
			if lo := min(x, y); lo > 0 {
				spread = max(spread, math.Abs(x-y)/lo)
			}
		}
	}
	if len(res) > 0 {
		slices.Sort(res)
		if n := len(res); n%2 == 1 {
			floor = res[n/2]
		} else {
			floor = (res[n/2-1] + res[n/2]) / 2
		}
	}
	return max(spread, floor), spread, floor
}

// Summarize sorts values in place and returns their mean and percentiles;
// all zero for no values.
func Summarize(values []float64) Summary {
	if len(values) == 0 {
		return Summary{}
	}
	slices.Sort(values)
	sum := 0.0
	for _, v := range values {
		sum += v
	}
	return Summary{
		Mean: sum / float64(len(values)),
		P50:  Percentile(values, 50),
		P90:  Percentile(values, 90),
		P99:  Percentile(values, 99),
	}
}

// maxCDFPoints bounds the CDF written into the JSON report, so a run of a
// million requests still writes a small file that plots the same curve.
const maxCDFPoints = 1000

// CDF returns the empirical distribution of sorted values as [value,
// fraction ≤ value] pairs: every sample when there are at most maxCDFPoints,
// otherwise maxCDFPoints evenly spaced quantiles (always including the
// smallest and the largest sample).
func CDF(sorted []float64) [][2]float64 {
	n := len(sorted)
	if n == 0 {
		return [][2]float64{}
	}
	if n <= maxCDFPoints {
		out := make([][2]float64, n)
		for i, v := range sorted {
			out[i] = [2]float64{v, float64(i+1) / float64(n)}
		}
		return out
	}
	out := make([][2]float64, maxCDFPoints)
	for k := range maxCDFPoints {
		i := int(math.Round(float64(k) * float64(n-1) / float64(maxCDFPoints-1)))
		out[k] = [2]float64{sorted[i], float64(i+1) / float64(n)}
	}
	return out
}

// poissonGaps yields the inter-arrival times of a Poisson process of the
// given rate (per second): exponentially distributed with mean 1/rate.
type poissonGaps struct {
	rate float64
	r    interface{ ExpFloat64() float64 }
}

// next returns the next gap in seconds.
func (p *poissonGaps) next() float64 {
	return p.r.ExpFloat64() / p.rate
}
