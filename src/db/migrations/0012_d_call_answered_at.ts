/**
 * `calls.answered_at`: when the call was answered, to the millisecond (issue 21). `duration_seconds` is answer to
 * hang-up rounded to the nearest second; the callee's `joined_at` is kept to the second (CallParticipant's
 * timestamps are), so taking the answer time from it made 5.43 s of talk 6 s.
 */
export const up = /* sql */ `
ALTER TABLE calls ADD COLUMN answered_at timestamptz;
`;
