package qos

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// drain takes everything off s, in the order Next gives it.
func drain(s *Scheduler[string]) []string {
	var got []string
	for {
		v, _, ok := s.Next()
		if !ok {
			return got
		}
		got = append(got, v)
	}
}

func TestSchedulerPriorityAndRoundRobin(t *testing.T) {
	var s Scheduler[string]
	s.Push(3, "c3")
	s.Push(0, "a")
	s.Push(0, "b")
	got := drain(&s)
	// Class 0 first, in push order; the lower class after (it waited two
	// rounds, below MaxRounds).
	require.Equal(t, []string{"a", "b", "c3"}, got)
	require.Equal(t, 0, s.Len())
}

func TestSchedulerExpress(t *testing.T) {
	var s Scheduler[string]
	s.Push(0, "bulk1")
	s.Push(0, "bulk2")
	s.Push(2, "low")
	s.PushExpress(0, "small1")
	s.PushExpress(2, "small-low")
	s.PushExpress(0, "small2")
	got := drain(&s)
	// Express items first within their class, in order; classes keep
	// their order (class 2's express item does not pass class 0).
	require.Equal(t, []string{"small1", "small2", "bulk1", "bulk2", "small-low", "low"}, got)
	require.Equal(t, 0, s.Len())
}

func TestSchedulerNoStarvation(t *testing.T) {
	s := Scheduler[int]{MaxRounds: 4}
	s.Push(Lowest, 7)
	s.Push(0, 0)
	served := map[Class]int{}
	for range 1000 {
		v, c, ok := s.Next()
		require.True(t, ok)
		served[c]++
		s.Push(c, v) // both always have more work
	}
	// Class 0 takes 4 rounds, then class 7 one: 1 in 5.
	require.Equal(t, 200, served[Lowest])
	require.Equal(t, 800, served[0])
}

func TestSchedulerClamps(t *testing.T) {
	var s Scheduler[int]
	s.Push(200, 1)
	_, c, ok := s.Next()
	require.True(t, ok)
	require.Equal(t, Lowest, c)
	_, _, ok = s.Next()
	require.False(t, ok)
}

func TestBucket(t *testing.T) {
	now := time.Unix(0, 0)
	b := Bucket{Rate: 1000, Burst: 100}
	require.Zero(t, b.Take(100, now))
	wait := b.Take(50, now)
	require.InDelta(t, 50*time.Millisecond, wait, float64(time.Millisecond))
	now = now.Add(wait)
	require.Zero(t, b.Take(50, now))
	// A request above the burst passes once the bucket is full.
	now = now.Add(time.Second)
	require.Zero(t, b.Take(500, now))
	require.NotZero(t, b.Take(1, now))

	var unlimited Bucket
	require.Zero(t, unlimited.Take(1<<30, now))
}

func TestQuota(t *testing.T) {
	q := Quota{Name: "window memory", Limit: 100}
	require.NoError(t, q.Acquire(60))
	err := q.Acquire(60)
	require.True(t, errors.Is(err, ErrQuota), err)
	require.Contains(t, err.Error(), "window memory: 60 of 100")
	q.Release(60)
	require.NoError(t, q.Acquire(100))
	require.EqualValues(t, 100, q.Used())
}
