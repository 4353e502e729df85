package provider

import (
	"fmt"
	"net/http"
)

// The executions below are the provider's business rules. Each runs with the
// server mutex held, and its answer, a success or a refusal, is stored under
// the idempotency key: a retry of a refused capture is refused again, the same
// way, without looking at the state a second time.

func authorize(req AuthorizeRequest) execution {
	return func(m *merchant) answer {
		a := &Authorization{
			ID:          newID("auth_"),
			Status:      StatusAuthorized,
			AmountMinor: req.AmountMinor,
			Currency:    req.Currency,
			Reference:   req.Reference,
			Metadata:    req.Metadata,
		}
		m.authorizations[a.ID] = a
		m.counters[KindAuthorize]++
		return jsonAnswer(http.StatusCreated, a)
	}
}

func capture(authID string, amountMinor int64) execution {
	return func(m *merchant) answer {
		a, ok := m.authorizations[authID]
		switch {
		case !ok:
			return authorizationNotFound(authID)
		case a.Status == StatusCaptured && m.duplicating:
			// The injected duplicate: the same capture again, on top of the first.
			a.CapturedMinor += amountMinor
			m.counters[KindCapture]++
			return jsonAnswer(http.StatusOK, Capture{ID: newID("cap_"), AuthorizationID: a.ID, AmountMinor: amountMinor, Status: StatusSucceeded})
		case a.Status == StatusCaptured:
			return problemAnswer(http.StatusConflict, CodeAlreadyCaptured,
				fmt.Sprintf("authorization %s was already captured (%d)", a.ID, a.CapturedMinor))
		case a.Status != StatusAuthorized:
			return problemAnswer(http.StatusConflict, CodeInvalidState,
				fmt.Sprintf("authorization %s is %s and cannot be captured", a.ID, a.Status))
		case amountMinor > a.AmountMinor:
			return problemAnswer(http.StatusUnprocessableEntity, CodeAmountTooLarge,
				fmt.Sprintf("capture of %d exceeds the authorized %d", amountMinor, a.AmountMinor))
		}
		// A capture is final: capturing less releases the rest of the hold.
		a.Status = StatusCaptured
		a.CapturedMinor = amountMinor
		m.counters[KindCapture]++
		return jsonAnswer(http.StatusOK, Capture{
			ID:              newID("cap_"),
			AuthorizationID: a.ID,
			AmountMinor:     amountMinor,
			Status:          StatusSucceeded,
		})
	}
}

func void(authID string) execution {
	return func(m *merchant) answer {
		a, ok := m.authorizations[authID]
		switch {
		case !ok:
			return authorizationNotFound(authID)
		case a.Status != StatusAuthorized:
			return problemAnswer(http.StatusConflict, CodeInvalidState,
				fmt.Sprintf("authorization %s is %s and cannot be voided", a.ID, a.Status))
		}
		a.Status = StatusVoided
		m.counters[KindVoid]++
		return jsonAnswer(http.StatusOK, a)
	}
}

func refund(authID string, amountMinor int64) execution {
	return func(m *merchant) answer {
		a, ok := m.authorizations[authID]
		switch {
		case !ok:
			return authorizationNotFound(authID)
		case a.Status != StatusCaptured:
			return problemAnswer(http.StatusConflict, CodeInvalidState,
				fmt.Sprintf("authorization %s is %s; only captured money can be refunded", a.ID, a.Status))
		case amountMinor > a.CapturedMinor-a.RefundedMinor:
			return problemAnswer(http.StatusUnprocessableEntity, CodeAmountTooLarge,
				fmt.Sprintf("refund of %d exceeds the %d captured and not yet refunded",
					amountMinor, a.CapturedMinor-a.RefundedMinor))
		}
		a.RefundedMinor += amountMinor
		m.counters[KindRefund]++
		return jsonAnswer(http.StatusCreated, Refund{
			ID:              newID("ref_"),
			AuthorizationID: a.ID,
			AmountMinor:     amountMinor,
			Status:          StatusSucceeded,
		})
	}
}

func authorizationNotFound(id string) answer {
	return problemAnswer(http.StatusNotFound, CodeNotFound, fmt.Sprintf("authorization %s not found", id))
}
