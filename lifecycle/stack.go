package lifecycle

import "errors"

// Stack records how to stop each started component; Stop runs them in the
// reverse order of Push. Start a component, Push its stop, go on: a
// failure later is unwound by the deferred Stop.
type Stack struct {
	stops []func() error
}

// Push adds the stop of a component just started.
func (s *Stack) Push(stop func() error) { s.stops = append(s.stops, stop) }

// Stop stops every pushed component, last pushed first, and returns their
// errors joined. It may be called again (it does nothing more).
func (s *Stack) Stop() error {
	var errs []error
	for i := len(s.stops) - 1; i >= 0; i-- {
		if err := s.stops[i](); err != nil {
			errs = append(errs, err)
		}
	}
	s.stops = nil
	return errors.Join(errs...)
}
