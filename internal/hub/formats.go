package hub

// The formats below are ported from ajv-formats 3.0.1 (dist/formats.js,
// "full" mode), MIT License, Copyright (c) 2020 Evgeny Poberezkin: the
// formats the MCP TypeScript SDK's client (1.32.2, through ajv 8 and
// addFormats(ajv)) checks a result's structuredContent with. Its regular
// expressions are ECMA-262, which RE2 reads the same way but for: Go's (?i)
// lets k and s match KELVIN SIGN and LONG S, JavaScript's /i without u does
// not (so the patterns here spell out A-Z instead); \s is wider in
// JavaScript (jsSpace); the m flag (byte, in isByte); and lookaround, which
// RE2 lacks (in Go code: duration, hostname, url).

import (
	"encoding/json"
	"errors"
	"math"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// errAjvFormat is why a value fails a format checked as ajv-formats does.
var errAjvFormat = errors.New("the MCP TypeScript SDK's ajv-formats rejects it")

// ajvFormats are ajv-formats' formats by name. "regex" is not here: the
// schema library checks it with the compiler's regexp engine (see
// compileSchema). float, double, password and binary accept anything, as
// in ajv-formats.
var ajvFormats = map[string]func(any) error{
	"date":                      stringFormat(isDate),
	"time":                      stringFormat(timeChecker(true)),
	"date-time":                 stringFormat(dateTimeChecker(true)),
	"iso-time":                  stringFormat(timeChecker(false)),
	"iso-date-time":             stringFormat(dateTimeChecker(false)),
	"duration":                  stringFormat(isDuration),
	"uri":                       stringFormat(isURI),
	"uri-reference":             stringFormat(uriReferenceRE.MatchString),
	"uri-template":              stringFormat(uriTemplateRE.MatchString),
	"url":                       stringFormat(isURL),
	"email":                     stringFormat(emailRE.MatchString),
	"hostname":                  stringFormat(isHostname),
	"ipv4":                      stringFormat(ipv4RE.MatchString),
	"ipv6":                      stringFormat(ipv6RE.MatchString),
	"uuid":                      stringFormat(uuidRE.MatchString),
	"json-pointer":              stringFormat(jsonPointerRE.MatchString),
	"json-pointer-uri-fragment": stringFormat(jsonPointerURIFragmentRE.MatchString),
	"relative-json-pointer":     stringFormat(relativeJSONPointerRE.MatchString),
	"byte":                      stringFormat(isByte),
	"int32":                     validateInt32,
	"int64":                     validateInt64,
	"float":                     anyValue,
	"double":                    anyValue,
	"password":                  anyValue,
	"binary":                    anyValue,
}

// registerAjvFormats makes c check formats as ajv-formats does, and leaves
// the formats the schema library knows and ajv-formats does not (which Ajv
// ignores) annotations.
func registerAjvFormats(c *jsonschema.Compiler) {
	for name, validate := range ajvFormats {
		c.RegisterFormat(&jsonschema.Format{Name: name, Validate: validate})
	}
	for _, name := range []string{"period", "semver", "iri", "iri-reference"} {
		c.RegisterFormat(&jsonschema.Format{Name: name, Validate: anyValue})
	}
}

func anyValue(any) error { return nil }

// stringFormat checks strings with ok; Ajv checks a string format on
// strings only.
func stringFormat(ok func(string) bool) func(any) error {
	return func(v any) error {
		if s, isString := v.(string); isString && !ok(s) {
			return errAjvFormat
		}
		return nil
	}
}

// jsSpace is ECMA-262's \s: WhiteSpace and LineTerminator.
const jsSpace = `\t\n\v\f\r \x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}\x{feff}`

func isJSSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0xfeff:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}

var (
	dateRE = regexp.MustCompile(`^(\d\d\d\d)-(\d\d)-(\d\d)$`)
	timeRE = regexp.MustCompile(`^(\d\d):(\d\d):(\d\d(?:\.\d+)?)([zZ]|([+-])(\d\d)(?::?(\d\d))?)?$`)
	// duration's P(?!$) and T(?=\d) are in isDuration.
	durationRE     = regexp.MustCompile(`^P(?:(?:\d+Y)?(?:\d+M)?(?:\d+D)?(?:T(?:\d+H(?:\d+M)?(?:\d+S)?|\d+M(?:\d+S)?|\d+S))?|(?:\d+W)?)$`)
	uriRE          = regexp.MustCompile(`^(?:[a-zA-Z][a-zA-Z0-9+\-.]*:)(?:\/?\/(?:(?:[a-zA-Z0-9\-._~!$&'()*+,;=:]|%[0-9a-fA-F]{2})*@)?(?:\[(?:(?:(?:(?:[0-9a-fA-F]{1,4}:){6}|::(?:[0-9a-fA-F]{1,4}:){5}|(?:[0-9a-fA-F]{1,4})?::(?:[0-9a-fA-F]{1,4}:){4}|(?:(?:[0-9a-fA-F]{1,4}:){0,1}[0-9a-fA-F]{1,4})?::(?:[0-9a-fA-F]{1,4}:){3}|(?:(?:[0-9a-fA-F]{1,4}:){0,2}[0-9a-fA-F]{1,4})?::(?:[0-9a-fA-F]{1,4}:){2}|(?:(?:[0-9a-fA-F]{1,4}:){0,3}[0-9a-fA-F]{1,4})?::[0-9a-fA-F]{1,4}:|(?:(?:[0-9a-fA-F]{1,4}:){0,4}[0-9a-fA-F]{1,4})?::)(?:[0-9a-fA-F]{1,4}:[0-9a-fA-F]{1,4}|(?:(?:25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(?:25[0-5]|2[0-4]\d|[01]?\d\d?))|(?:(?:[0-9a-fA-F]{1,4}:){0,5}[0-9a-fA-F]{1,4})?::[0-9a-fA-F]{1,4}|(?:(?:[0-9a-fA-F]{1,4}:){0,6}[0-9a-fA-F]{1,4})?::)|[Vv][0-9a-fA-F]+\.[a-zA-Z0-9\-._~!$&'()*+,;=:]+)\]|(?:(?:25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(?:25[0-5]|2[0-4]\d|[01]?\d\d?)|(?:[a-zA-Z0-9\-._~!$&'()*+,;=]|%[0-9a-fA-F]{2})*)(?::\d*)?(?:\/(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})*)*|\/(?:(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})+(?:\/(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})*)*)?|(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})+(?:\/(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})*)*)(?:\?(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@/?]|%[0-9a-fA-F]{2})*)?(?:#(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@/?]|%[0-9a-fA-F]{2})*)?$`)
	uriReferenceRE = regexp.MustCompile(`^(?:[a-zA-Z][a-zA-Z0-9+\-.]*:)?(?:\/?\/(?:(?:[a-zA-Z0-9\-._~!$&'()*+,;=:]|%[0-9a-fA-F]{2})*@)?(?:\[(?:(?:(?:(?:[0-9a-fA-F]{1,4}:){6}|::(?:[0-9a-fA-F]{1,4}:){5}|(?:[0-9a-fA-F]{1,4})?::(?:[0-9a-fA-F]{1,4}:){4}|(?:(?:[0-9a-fA-F]{1,4}:){0,1}[0-9a-fA-F]{1,4})?::(?:[0-9a-fA-F]{1,4}:){3}|(?:(?:[0-9a-fA-F]{1,4}:){0,2}[0-9a-fA-F]{1,4})?::(?:[0-9a-fA-F]{1,4}:){2}|(?:(?:[0-9a-fA-F]{1,4}:){0,3}[0-9a-fA-F]{1,4})?::[0-9a-fA-F]{1,4}:|(?:(?:[0-9a-fA-F]{1,4}:){0,4}[0-9a-fA-F]{1,4})?::)(?:[0-9a-fA-F]{1,4}:[0-9a-fA-F]{1,4}|(?:(?:25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(?:25[0-5]|2[0-4]\d|[01]?\d\d?))|(?:(?:[0-9a-fA-F]{1,4}:){0,5}[0-9a-fA-F]{1,4})?::[0-9a-fA-F]{1,4}|(?:(?:[0-9a-fA-F]{1,4}:){0,6}[0-9a-fA-F]{1,4})?::)|[Vv][0-9a-fA-F]+\.[a-zA-Z0-9\-._~!$&'()*+,;=:]+)\]|(?:(?:25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(?:25[0-5]|2[0-4]\d|[01]?\d\d?)|(?:[a-zA-Z0-9\-._~!$&'"()*+,;=]|%[0-9a-fA-F]{2})*)(?::\d*)?(?:\/(?:[a-zA-Z0-9\-._~!$&'"()*+,;=:@]|%[0-9a-fA-F]{2})*)*|\/(?:(?:[a-zA-Z0-9\-._~!$&'"()*+,;=:@]|%[0-9a-fA-F]{2})+(?:\/(?:[a-zA-Z0-9\-._~!$&'"()*+,;=:@]|%[0-9a-fA-F]{2})*)*)?|(?:[a-zA-Z0-9\-._~!$&'"()*+,;=:@]|%[0-9a-fA-F]{2})+(?:\/(?:[a-zA-Z0-9\-._~!$&'"()*+,;=:@]|%[0-9a-fA-F]{2})*)*)?(?:\?(?:[a-zA-Z0-9\-._~!$&'"()*+,;=:@/?]|%[0-9a-fA-F]{2})*)?(?:#(?:[a-zA-Z0-9\-._~!$&'"()*+,;=:@/?]|%[0-9a-fA-F]{2})*)?$`)
	uriTemplateRE  = regexp.MustCompile(`^(?:(?:[^\x00-\x20"'<>%\\^\x60{|}]|%[0-9a-fA-F]{2})|\{[+#./;?&=,!@|]?(?:[a-zA-Z0-9_]|%[0-9a-fA-F]{2})+(?::[1-9][0-9]{0,3}|\*)?(?:,(?:[a-zA-Z0-9_]|%[0-9a-fA-F]{2})+(?::[1-9][0-9]{0,3}|\*)?)*\})*$`)
	// url is /iu: Unicode case folding, as Go's (?i). Its lookaheads for
	// private IPv4 addresses are in isURL.
	urlSchemeRE   = regexp.MustCompile(`^(?i:https?|ftp)://`)
	urlIPv4RE     = regexp.MustCompile(`^([1-9]\d?|1\d\d|2[01]\d|22[0-3])\.(1?\d{1,2}|2[0-4]\d|25[0-5])\.(?:1?\d{1,2}|2[0-4]\d|25[0-5])\.(?:[1-9]\d?|1\d\d|2[0-4]\d|25[0-4])` + urlTail)
	urlHostnameRE = regexp.MustCompile(`(?i)^(?:(?:[a-z0-9\x{a1}-\x{ffff}]+-)*[a-z0-9\x{a1}-\x{ffff}]+)(?:\.(?:[a-z0-9\x{a1}-\x{ffff}]+-)*[a-z0-9\x{a1}-\x{ffff}]+)*(?:\.(?:[a-z\x{a1}-\x{ffff}]{2,}))` + urlTail)
	emailRE       = regexp.MustCompile(`^[a-zA-Z0-9!#$%&'*+/=?^_\x60{|}~-]+(?:\.[a-zA-Z0-9!#$%&'*+/=?^_\x60{|}~-]+)*@(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?\.)+[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?$`)
	// hostname's (?=.{1,253}\.?$) is in isHostname.
	hostnameRE               = regexp.MustCompile(`^[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[-0-9a-zA-Z]{0,61}[0-9a-zA-Z])?)*\.?$`)
	ipv4RE                   = regexp.MustCompile(`^(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$`)
	ipv6RE                   = regexp.MustCompile(`^((([0-9a-fA-F]{1,4}:){7}([0-9a-fA-F]{1,4}|:))|(([0-9a-fA-F]{1,4}:){6}(:[0-9a-fA-F]{1,4}|((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3})|:))|(([0-9a-fA-F]{1,4}:){5}(((:[0-9a-fA-F]{1,4}){1,2})|:((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3})|:))|(([0-9a-fA-F]{1,4}:){4}(((:[0-9a-fA-F]{1,4}){1,3})|((:[0-9a-fA-F]{1,4})?:((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}))|:))|(([0-9a-fA-F]{1,4}:){3}(((:[0-9a-fA-F]{1,4}){1,4})|((:[0-9a-fA-F]{1,4}){0,2}:((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}))|:))|(([0-9a-fA-F]{1,4}:){2}(((:[0-9a-fA-F]{1,4}){1,5})|((:[0-9a-fA-F]{1,4}){0,3}:((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}))|:))|(([0-9a-fA-F]{1,4}:){1}(((:[0-9a-fA-F]{1,4}){1,6})|((:[0-9a-fA-F]{1,4}){0,4}:((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}))|:))|(:(((:[0-9a-fA-F]{1,4}){1,7})|((:[0-9a-fA-F]{1,4}){0,5}:((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}))|:)))$`)
	uuidRE                   = regexp.MustCompile(`^(?:[uU][rR][nN]:[uU][uU][iI][dD]:)?[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$`)
	jsonPointerRE            = regexp.MustCompile(`^(?:\/(?:[^~/]|~0|~1)*)*$`)
	jsonPointerURIFragmentRE = regexp.MustCompile(`^#(?:\/(?:[a-zA-Z0-9_\-.!$&'()*+,;:=@]|%[0-9a-fA-F]{2}|~0|~1)*)*$`)
	relativeJSONPointerRE    = regexp.MustCompile(`^(?:0|[1-9][0-9]*)(?:#|(?:\/(?:[^~/]|~0|~1)*)*)$`)
	byteRE                   = regexp.MustCompile(`^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$`)
)

// urlTail is url's port and path: (?::\d{2,5})?(?:\/[^\s]*)?$.
const urlTail = `(?::\d{2,5})?(?:/[^` + jsSpace + `]*)?$`

var daysInMonth = [...]int{0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31}

func isDate(s string) bool {
	m := dateRE.FindStringSubmatch(s)
	if m == nil {
		return false
	}
	year, _ := strconv.Atoi(m[1])
	month, _ := strconv.Atoi(m[2])
	day, _ := strconv.Atoi(m[3])
	if month < 1 || month > 12 || day < 1 {
		return false
	}
	if month == 2 && year%4 == 0 && (year%100 != 0 || year%400 == 0) {
		return day <= 29
	}
	return day <= daysInMonth[month]
}

// timeChecker is ajv-formats' getTime: with strictTimeZone, a time without
// a zone is not valid.
func timeChecker(strictTimeZone bool) func(string) bool {
	return func(s string) bool {
		m := timeRE.FindStringSubmatch(s)
		if m == nil {
			return false
		}
		hr, _ := strconv.Atoi(m[1])
		minute, _ := strconv.Atoi(m[2])
		sec, _ := strconv.ParseFloat(m[3], 64)
		tzSign := 1
		if m[5] == "-" {
			tzSign = -1
		}
		tzH, _ := strconv.Atoi(m[6]) // 0 when absent, as +(undefined || 0)
		tzM, _ := strconv.Atoi(m[7])
		if tzH > 23 || tzM > 59 || (strictTimeZone && m[4] == "") {
			return false
		}
		if hr <= 23 && minute <= 59 && sec < 60 {
			return true
		}
		// A leap second: 23:59:60 in UTC.
		utcMin := minute - tzM*tzSign
		utcHr := hr - tzH*tzSign
		if utcMin < 0 {
			utcHr--
		}
		return (utcHr == 23 || utcHr == -1) && (utcMin == 59 || utcMin == -1) && sec < 61
	}
}

// dateTimeChecker is ajv-formats' getDateTime: a date and a time split by
// str.split(/t|\s/i) into exactly two parts.
func dateTimeChecker(strictTimeZone bool) func(string) bool {
	isTime := timeChecker(strictTimeZone)
	return func(s string) bool {
		i := strings.IndexFunc(s, isDateTimeSeparator)
		if i < 0 {
			return false
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		t := s[i+size:]
		return strings.IndexFunc(t, isDateTimeSeparator) < 0 && isDate(s[:i]) && isTime(t)
	}
}

func isDateTimeSeparator(r rune) bool { return r == 't' || r == 'T' || isJSSpace(r) }

func isDuration(s string) bool { return s != "P" && durationRE.MatchString(s) }

// isURI is ajv-formats' uri: it needs a "/" or ":" (NOT_URI_FRAGMENT).
func isURI(s string) bool { return strings.ContainsAny(s, "/:") && uriRE.MatchString(s) }

// isHostname adds hostname's lookahead (?=.{1,253}\.?$) to hostnameRE,
// which matches only ASCII.
func isHostname(s string) bool {
	n := len(s)
	return (n >= 1 && n <= 253 || n == 254 && s[253] == '.') && hostnameRE.MatchString(s)
}

// isURL is ajv-formats' url. Its user info (?:\S+(?::\S*)?@)? is any
// non-space text ending in "@", so the host starts after "://" or after
// any "@" with no space before it; at one of these, an IPv4 address not
// in 10/8, 127/8, 169.254/16, 192.168/16 or 172.16/12 (the negative
// lookaheads) or a name must follow.
func isURL(s string) bool {
	loc := urlSchemeRE.FindStringIndex(s)
	if loc == nil {
		return false
	}
	rest := s[loc[1]:]
	for i := 0; ; {
		if i != 1 && isURLHost(rest[i:]) { // i == 1: empty user info
			return true
		}
		j := strings.IndexByte(rest[i:], '@')
		if j < 0 {
			return false
		}
		i += j + 1
		if strings.IndexFunc(rest[:i], isJSSpace) >= 0 {
			return false
		}
	}
}

func isURLHost(s string) bool {
	if m := urlIPv4RE.FindStringSubmatch(s); m != nil {
		a, b := m[1], m[2]
		private := a == "10" || a == "127" || a == "169" && b == "254" || a == "192" && b == "168" ||
			a == "172" && len(b) == 2 && b >= "16" && b <= "31"
		if !private {
			return true
		}
	}
	return urlHostnameRE.MatchString(s)
}

// isByte is ajv-formats' byte: its pattern has the m flag, so it holds when
// any line matches, ECMA-262's line terminators ending lines.
func isByte(s string) bool {
	start := 0
	for i, r := range s {
		if r == '\n' || r == '\r' || r == 0x2028 || r == 0x2029 {
			if byteRE.MatchString(s[start:i]) {
				return true
			}
			start = i + utf8.RuneLen(r)
		}
	}
	return byteRE.MatchString(s[start:])
}

// jsNumber is v as JSON.parse reads it: a float64, ±Inf past its range.
func jsNumber(v any) (float64, bool) {
	switch v := v.(type) {
	case json.Number:
		f, _ := strconv.ParseFloat(string(v), 64)
		return f, true
	case float64:
		return v, true
	case int:
		return float64(v), true
	case int64:
		return float64(v), true
	}
	return 0, false
}

// isJSInteger is Number.isInteger.
func isJSInteger(f float64) bool { return !math.IsInf(f, 0) && !math.IsNaN(f) && math.Trunc(f) == f }

func validateInt32(v any) error {
	if f, ok := jsNumber(v); ok && !(isJSInteger(f) && f >= math.MinInt32 && f <= math.MaxInt32) {
		return errors.New("not an integer from -2147483648 to 2147483647")
	}
	return nil
}

func validateInt64(v any) error {
	if f, ok := jsNumber(v); ok && !isJSInteger(f) {
		return errors.New("not an integer")
	}
	return nil
}
