package eta

import (
	"testing"
	"time"
)

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		got, want string
	}{
		{FormatRate(2400.4), "2400/s"},
		{FormatRate(812), "812/s"},
		{FormatRate(35.04), "35/s"},
		{FormatRate(3.5), "3.5/s"},
		{FormatRate(0.25), "0.25/s"},
		{FormatRemaining(-time.Second), "0s"},
		{FormatRemaining(400 * time.Millisecond), "0.4s"},
		{FormatRemaining(12 * time.Second), "12s"},
		{FormatRemaining(3*time.Minute + 5*time.Second), "3m05s"},
		{FormatRemaining(time.Hour + 2*time.Minute), "1h02m"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestAverageAndRemaining(t *testing.T) {
	if r := Average(100, 2*time.Second); r != 50 {
		t.Errorf("Average(100, 2s) = %v, want 50", r)
	}
	if r := Average(0, time.Second); r != 0 {
		t.Errorf("Average(0, 1s) = %v, want 0", r)
	}
	if left, ok := Remaining(50, 100, 300); !ok || left != 4*time.Second {
		t.Errorf("Remaining(50, 100, 300) = %v, %v; want 4s, true", left, ok)
	}
	for _, tc := range [][3]float64{{0, 1, 2}, {1, 2, 2}, {1, 1, 0}} {
		if _, ok := Remaining(tc[0], int64(tc[1]), int64(tc[2])); ok {
			t.Errorf("Remaining%v is known", tc)
		}
	}
}
