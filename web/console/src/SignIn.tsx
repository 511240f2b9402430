import { useState } from 'preact/hooks';
import { describeError, type ApiClient } from '../../api/client';
import type { Session } from './session';

interface Props {
  api: ApiClient;
  publishableKey: string | undefined;
  notice: string | undefined;
  onSignedIn: (session: Session) => void;
}

/** The organisation's name from a login document with `include=organisation`. */
function organisationNameOf(included: unknown): string | undefined {
  if (!Array.isArray(included)) return undefined;
  const organisation = included.find((r: { type?: string }) => r.type === 'Organisation') as { attributes?: { name?: string } } | undefined;
  return organisation?.attributes?.name;
}

export function SignIn({ api, publishableKey, notice, onSignedIn }: Props) {
  const [email, setEmail] = useState('');
  const [password, setPassword] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | undefined>();

  async function submit(event: Event) {
    event.preventDefault();
    if (!publishableKey) return;
    setBusy(true);
    setError(undefined);
    try {
      const { data, error: failure } = await api.POST('/api/users/login', {
        params: { query: { include: 'organisation' } },
        body: { data: { type: 'User', attributes: { email, password } } },
        headers: { Authorization: `Bearer ${publishableKey}` },
      });
      if (!data) {
        setError(describeError(failure, 'Signing in failed.'));
        return;
      }
      const meta = data.meta as { token: string; token_expires_at: string };
      onSignedIn({
        token: meta.token,
        expiresAt: meta.token_expires_at,
        userId: data.data.id,
        email: data.data.attributes.email ?? email,
        fullName: data.data.attributes.full_name ?? '',
        organisationName: organisationNameOf(data.included) ?? '',
      });
    } catch (cause) {
      setError(describeError(cause, 'The server could not be reached.'));
    } finally {
      setBusy(false);
    }
  }

  return (
    <main class="signin" id="main">
      <form class="card" onSubmit={submit} aria-labelledby="signin-title">
        <h1 id="signin-title">Parley console</h1>
        <p class="muted">Sign in to answer conversations and calls.</p>
        {notice && (
          <p class="banner info" role="status">
            {notice}
          </p>
        )}
        {!publishableKey && (
          <p class="banner error" role="alert">
            This link has no organisation key. Open the console with the link that <code>parley serve</code> or <code>parley demo</code>{' '}
            prints (it ends in <code>#key=…</code>).
          </p>
        )}
        <label for="email">E-mail</label>
        <input id="email" type="email" autocomplete="username" required value={email} onInput={(e) => setEmail(e.currentTarget.value)} />
        <label for="password">Password</label>
        <input
          id="password"
          type="password"
          autocomplete="current-password"
          required
          value={password}
          onInput={(e) => setPassword(e.currentTarget.value)}
        />
        {error && (
          <p class="banner error" role="alert">
            {error}
          </p>
        )}
        <button class="button primary" type="submit" disabled={busy || !publishableKey}>
          {busy ? 'Signing in…' : 'Sign in'}
        </button>
      </form>
    </main>
  );
}
