package entitle

import (
	"reflect"
	"strings"
	"testing"

	"github.com/caddy-cascade/cascade/hierarchy"
)

func TestParseEntry(t *testing.T) {
	tests := []struct {
		name    string
		raw     string
		want    Entitlement
		wantErr string // a part of the error; "" for none
	}{
		{
			name: "plan, limits and fields",
			raw:  `{"plan":"pro","limits":[{"count":100,"per":"h","dimension":"tokens"}],"region":"eu","seats":12,"price":1.50,"trial":false}`,
			want: Entitlement{
				Plan:   "pro",
				Limits: []*hierarchy.Limit{{Count: 100, Per: "h", Dimension: "tokens"}},
				Fields: map[string]string{"plan": "pro", "region": "eu", "seats": "12", "price": "1.50", "trial": "false"},
			},
		},
		{
			name: "objects, arrays and nulls are not fields",
			raw:  `{"plan":null,"owner":{"name":"x"},"tags":["a"],"note":null,"limits":null}`,
		},
		{name: "no limits", raw: `{"limits":[]}`},
		{name: "empty", raw: `{}`},
		{name: "escaped string", raw: `{"name":"a\"b\u00e9"}`, want: Entitlement{Fields: map[string]string{"name": `a"bé`}}},
		{name: "a plan that is no string", raw: `{"plan":3}`, wantErr: "plan: want a string, not 3"},
		{name: "a misspelt limit field", raw: `{"limits":[{"cuont":100,"per":"h"}]}`, wantErr: `unknown field "cuont"`},
		{name: "a null limit", raw: `{"limits":[null]}`, wantErr: "limit 1 is null"},
		{name: "limits no array", raw: `{"limits":{"count":1}}`, wantErr: "limits:"},
		{name: "an array", raw: `[1]`, wantErr: "want an object, not a JSON array"},
		{name: "null", raw: `null`, wantErr: "want an object, not null"},
		{name: "not JSON", raw: `plan: pro`, wantErr: "invalid character"},
		{name: "both errors", raw: `{"plan":true,"limits":[null]}`, wantErr: "limit 1 is null"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseEntry([]byte(tt.raw))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}
