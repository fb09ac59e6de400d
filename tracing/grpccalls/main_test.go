package grpccalls_test

import (
	"testing"

	"github.com/phasegate/phasegate/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }
