// Package nilcheck tells a nil argument from a usable one, for the
// constructors that refuse one with ErrConfig.
package nilcheck

import "reflect"

// IsNil reports whether v is nil, or a nil pointer, map, func, channel,
// slice or interface inside an interface.
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice, reflect.Interface:
		return rv.IsNil()
	}
	return false
}
