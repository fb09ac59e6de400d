package eta

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// Average is done units over d, per second; zero when either is.
func Average(done int64, d time.Duration) float64 {
	if done <= 0 || d <= 0 {
		return 0
	}
	return float64(done) / d.Seconds()
}

// Remaining is the time left to reach total from done at rate units per
// second. It is known (ok) when the rate is positive and the total known
// and not reached.
func Remaining(rate float64, done, total int64) (left time.Duration, ok bool) {
	if rate > 0 && total > 0 && done < total {
		return time.Duration(float64(total-done) / rate * float64(time.Second)), true
	}
	return 0, false
}

// FormatRate renders units per second with two or three significant
// digits: "2400/s", "812/s", "3.5/s", "0.25/s".
func FormatRate(r float64) string {
	switch {
	case r >= 100:
		return strconv.FormatFloat(math.Round(r), 'f', -1, 64) + "/s"
	case r >= 10:
		return strconv.FormatFloat(math.Round(r*10)/10, 'f', -1, 64) + "/s"
	}
	return strconv.FormatFloat(math.Round(r*100)/100, 'f', -1, 64) + "/s"
}

// FormatRemaining renders a time left coarsely, as a person reads it:
// "0.4s", "12s", "3m05s", "1h02m".
func FormatRemaining(d time.Duration) string {
	switch {
	case d < 0:
		d = 0
		fallthrough
	case d < 10*time.Second:
		return strconv.FormatFloat(math.Round(d.Seconds()*10)/10, 'f', -1, 64) + "s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Round(time.Second).Seconds()))
	case d < time.Hour:
		d = d.Round(time.Second)
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	}
	d = d.Round(time.Minute)
	return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
}
