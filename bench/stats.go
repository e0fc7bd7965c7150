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
