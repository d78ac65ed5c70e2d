package watcher

import (
	"testing"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/echo"
)

func TestEchoOnly(t *testing.T) {
	ctrl := bus.ControllerRef{Kind: "CompositeController", Name: "c"}
	book := echo.NewBook(0)
	book.Record(&bus.Applied{Controller: ctrl, ParentUID: "p", Writes: []bus.Write{
		{UID: "p", From: "1", To: "2"}, {UID: "k", From: "5", To: "6"},
	}})
	w := &Watcher{echoes: book}
	cases := []struct {
		name   string
		reason string
		ctrl   string
		sus    *suspects
		want   bool
	}{
		{"own writes only", "every event behind the item was our write", ctrl.ID(),
			&suspects{updates: [][2]string{{"p", "2"}, {"k", "6"}}}, true},
		{"someone else's update", "one event is a version we did not write", ctrl.ID(),
			&suspects{updates: [][2]string{{"p", "2"}, {"k", "7"}}}, false},
		{"news", "a create, delete, resync or mapped change is always published", ctrl.ID(),
			&suspects{news: true, updates: [][2]string{{"p", "2"}}}, false},
		{"other controller", "one controller's write is news to another", bus.ControllerID("DecoratorController", "d"),
			&suspects{updates: [][2]string{{"p", "2"}}}, false},
		{"nothing known", "no suspects at all: publish", ctrl.ID(), nil, false},
		{"no updates", "an empty record is not an echo", ctrl.ID(), &suspects{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := w.echoOnly(tc.ctrl, tc.sus); got != tc.want {
				t.Errorf("%s: echoOnly = %v, want %v", tc.reason, got, tc.want)
			}
		})
	}
}
