package monitoring_test

import (
	"testing"

	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
)

func TestZZTry(t *testing.T) {
	_ = promql.NewEngine
	var _ storage.Queryable
}
