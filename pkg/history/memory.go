package history

import "sync"

// Memory is a Recorder that keeps records in memory, for tests of code that
// records (the worker SDK's) and for checks run in the same process. The zero
// value is ready to use.
type Memory struct {
	mu      sync.Mutex
	records []Record
}

// Record appends r.
func (m *Memory) Record(r Record) {
	m.mu.Lock()
	m.records = append(m.records, r)
	m.mu.Unlock()
}

// Records returns a copy of the records so far.
func (m *Memory) Records() []Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Record(nil), m.records...)
}

// Process returns the records so far as a Process named name, led by a fresh
// clock record, as ReadDir would return a file holding them.
func (m *Memory) Process(name string) Process {
	clock := clockRecord("")
	return Process{
		Name:       name,
		Records:    append([]Record{clock}, m.Records()...),
		MonoToWall: clock.Wall - clock.Start,
	}
}
