/** The SIP edge's settings, its rendered Kamailio configuration, and `sip serve` without PostgreSQL (runs everywhere). */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { parseCallEvent } from '../../src/sip/call-events.js';
import {
  edgeSources,
  kamailioDatabaseUrl,
  loadSipSettings,
  parseSipListen,
  renderKamailioConfig,
  TEMPLATE_PATH,
} from '../../src/sip/config.js';
import { haveProgram } from '../../src/sip/kamailio.js';

const run = promisify(execFile);

describe('SIP settings', () => {
  it('defaults to udp:127.0.0.1:5060 and parley.local', () => {
    const settings = loadSipSettings({});
    expect(settings).toMatchObject({ listen: 'udp:127.0.0.1:5060', domain: 'parley.local', ringTimeoutSeconds: 30 });
  });

  it('refuses a malformed listen address, domain or number, naming the variable', () => {
    expect(() => loadSipSettings({ SIP_LISTEN: 'sctp:127.0.0.1:5060' })).toThrow(/SIP_LISTEN/);
    expect(() => loadSipSettings({ SIP_LISTEN: 'udp:127.0.0.1:5060,tcp:localhost:5060' })).toThrow(/SIP_LISTEN/);
    expect(() => loadSipSettings({ SIP_LISTEN: 'tls:127.0.0.1:5061' })).toThrow(/SIP_TLS_CERT/);
    expect(() => loadSipSettings({ SIP_OUTBOUND_DENY_PREFIXES: '+1900,1976' })).toThrow(/SIP_OUTBOUND_DENY_PREFIXES/);
    expect(() => loadSipSettings({ SIP_LISTEN: 'udp:127.0.0.1:70000' })).toThrow(/SIP_LISTEN/);
    expect(() => loadSipSettings({ SIP_DOMAIN: 'bad domain"' })).toThrow(/SIP_DOMAIN/);
    expect(() => loadSipSettings({ SIP_RING_TIMEOUT_SECONDS: '0' })).toThrow(/SIP_RING_TIMEOUT_SECONDS/);
    // The dialog module refuses keep-alive intervals under 30 s.
    expect(() => loadSipSettings({ SIP_KEEPALIVE_SECONDS: '10' })).toThrow(/SIP_KEEPALIVE_SECONDS/);
  });

  it('sends agent calls to the voice runtime (VOICE_SIP_HOST/PORT), which trusts the UDP listen addresses', () => {
    expect(loadSipSettings({}).voiceAddress).toBe('127.0.0.1:5070');
    expect(loadSipSettings({ VOICE_SIP_HOST: '10.0.0.5', VOICE_SIP_PORT: '5090' }).voiceAddress).toBe('10.0.0.5:5090');
    // A runtime on every address is reached on its advertised address, else on loopback.
    expect(loadSipSettings({ VOICE_SIP_HOST: '0.0.0.0' }).voiceAddress).toBe('127.0.0.1:5070');
    expect(loadSipSettings({ VOICE_SIP_HOST: '0.0.0.0', VOICE_ADVERTISED_ADDRESS: '10.0.0.7' }).voiceAddress).toBe('10.0.0.7:5070');
    expect(() => loadSipSettings({ VOICE_SIP_HOST: 'voice.local' })).toThrow(/VOICE_SIP_HOST/);
    expect(edgeSources(parseSipListen('udp:127.0.0.1:5060,tcp:127.0.0.1:5060,udp:10.0.0.1:5062'))).toEqual([
      '127.0.0.1:5060',
      '10.0.0.1:5062',
    ]);
    expect(edgeSources(parseSipListen('udp:0.0.0.0:5060'))).toContain('127.0.0.1:5060');
    const rendered = renderKamailioConfig({
      settings: loadSipSettings({ VOICE_SIP_PORT: '5099' }),
      databaseUrl: 'postgres://u@h/db',
      runDir: '/tmp/x',
    });
    expect(rendered).toContain('#!define VOICE_ADDR "127.0.0.1:5099"');
  });

  it('carries the agent of an agent call in its events; a malformed agent id is refused', () => {
    const base = {
      event: 'initiated',
      call_id: 'c1@x',
      organisation_id: '0190a0b0-0000-7000-8000-000000000001',
      direction: 'inbound',
      source: 'trunk',
      caller_sip_user_id: '',
      callee_sip_user_id: '',
      from: '+15551234',
      to: '+442079460777',
      code: 0,
      at: '1795625144.5',
    };
    expect(parseCallEvent({ ...base, ai_agent_id: '0190A0B0-0000-7000-8000-0000000000AA' }).event?.ai_agent_id).toBe(
      '0190a0b0-0000-7000-8000-0000000000aa',
    );
    expect(parseCallEvent(base).event?.ai_agent_id).toBeUndefined();
    expect(parseCallEvent({ ...base, ai_agent_id: "x' OR 1=1" }).problems).toContain('ai_agent_id must be a UUID or absent');
  });

  it('takes a list of transports, and a deny list of outbound prefixes (premium rate by default)', () => {
    const settings = loadSipSettings({ SIP_LISTEN: 'udp:127.0.0.1:5060, tcp:127.0.0.1:5060,tcp:[::1]:5070' });
    expect(settings.listens).toEqual([
      { proto: 'udp', host: '127.0.0.1', port: 5060 },
      { proto: 'tcp', host: '127.0.0.1', port: 5060 },
      { proto: 'tcp', host: '[::1]', port: 5070 },
    ]);
    expect(loadSipSettings({}).outboundDenyPrefixes).toContain('+1900');
    expect(loadSipSettings({ SIP_OUTBOUND_DENY_PREFIXES: '' }).outboundDenyPrefixes).toEqual([]);
    expect(loadSipSettings({ SIP_OUTBOUND_DENY_PREFIXES: '+1900, +449' }).outboundDenyPrefixes).toEqual(['+1900', '+449']);
  });

  it('gives Kamailio a plain postgres:// URL (no query, explicit port)', () => {
    expect(kamailioDatabaseUrl('postgresql://u:p@db.example:6543/parley?sslmode=disable')).toBe('postgres://u:p@db.example:6543/parley');
    expect(kamailioDatabaseUrl('postgres://postgres@127.0.0.1/x')).toBe('postgres://postgres@127.0.0.1:5432/x');
    expect(() => kamailioDatabaseUrl('mysql://x@y/z')).toThrow(/postgres/);
  });
});

describe('the Kamailio configuration', () => {
  const input = {
    settings: loadSipSettings({ SIP_LISTEN: 'udp:127.0.0.1:25999', SIP_DOMAIN: 'voice.example.com' }),
    databaseUrl: 'postgres://postgres@127.0.0.1:5432/parley',
    runDir: '/tmp/parley-sip-test',
  };

  it('fills every placeholder of the template from the settings', () => {
    const rendered = renderKamailioConfig(input);
    expect(rendered).not.toMatch(/\{\{[A-Z_]+\}\}/);
    expect(rendered).toContain('listen=udp:127.0.0.1:25999');
    expect(rendered).toContain('#!define SIP_DOMAIN "voice.example.com"');
    expect(rendered).toContain('#!define DBURL "postgres://postgres@127.0.0.1:5432/parley"');
    expect(rendered).toContain('modparam("sqlops", "sqlcon", "events=>postgres://postgres@127.0.0.1:5432/parley")');
    expect(rendered).toContain('modparam("dialog", "ka_interval", 30)');
    expect(rendered).toContain('name=callevents;size=100000');
    // Nothing in the call path waits on Parley: no HTTP client at all.
    expect(rendered).not.toContain('http_client');
    expect(rendered).toContain('modparam("tm", "fr_inv_timer", 30000)');
  });

  it('renders TCP and TLS listen addresses, with the tls module and the certificate only when TLS is listed', () => {
    const plain = renderKamailioConfig(input);
    expect(plain).toContain('disable_tcp=yes');
    expect(plain).not.toMatch(/^#!define WITH_TLS/m);
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-siptls-'));
    const [cert, key] = ['cert.pem', 'key.pem'].map((f) => path.join(dir, f));
    for (const f of [cert, key]) fs.writeFileSync(f, '');
    const settings = loadSipSettings({
      SIP_LISTEN: 'udp:127.0.0.1:25999,tcp:127.0.0.1:25999,tls:127.0.0.1:26000',
      SIP_TLS_CERT: cert,
      SIP_TLS_KEY: key,
    });
    const rendered = renderKamailioConfig({ ...input, settings });
    expect(rendered).toContain('listen=udp:127.0.0.1:25999\nlisten=tcp:127.0.0.1:25999\nlisten=tls:127.0.0.1:26000');
    expect(rendered).toContain('disable_tcp=no');
    expect(rendered).toMatch(/^#!define WITH_TLS$/m);
    expect(rendered).toContain(`modparam("tls", "certificate", "${cert}")`);
    expect(rendered).toContain('modparam("uac", "reg_contact_addr", "127.0.0.1:25999")');
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('refuses values that would break out of a quoted string, and unknown placeholders', () => {
    expect(() => renderKamailioConfig({ ...input, runDir: '/tmp/a"b' })).toThrow(/RUN_DIR/);
    expect(() => renderKamailioConfig(input, 'listen={{NOPE}}')).toThrow(/NOPE/);
  });

  it.skipIf(!haveProgram('kamailio'))('is accepted by Kamailio (kamailio -c)', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-sipcfg-'));
    const file = path.join(dir, 'kamailio.cfg');
    fs.writeFileSync(file, renderKamailioConfig({ ...input, runDir: dir }));
    const { stderr, stdout } = await run('kamailio', ['-c', '-f', file]);
    expect(stdout + stderr).toContain('config file ok');
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('ships as a file beside src and dist', () => {
    expect(fs.existsSync(TEMPLATE_PATH)).toBe(true);
  });
});

describe('SIP over WebSocket (SIP_WS_LISTEN)', () => {
  const base = { SIP_LISTEN: 'udp:127.0.0.1:25999', SIP_DOMAIN: 'voice.example.com' };

  it('takes ws and wss addresses with the console origin, and refuses what cannot work', () => {
    const settings = loadSipSettings({
      ...base,
      SIP_WS_LISTEN: 'ws:127.0.0.1:25080',
      SIP_WS_ORIGINS: 'http://127.0.0.1:8080,https://console.example.com',
    });
    expect(settings.wsListens).toEqual([{ proto: 'ws', host: '127.0.0.1', port: 25080 }]);
    expect(settings.wsOrigins).toEqual(['http://127.0.0.1:8080', 'https://console.example.com']);
    // PUBLIC_URL's origin is the console's by default.
    expect(
      loadSipSettings({ ...base, SIP_WS_LISTEN: 'ws:127.0.0.1:25080', PUBLIC_URL: 'https://parley.example.com/base' }).wsOrigins,
    ).toEqual(['https://parley.example.com']);
    expect(() => loadSipSettings({ ...base, SIP_WS_LISTEN: 'ws:127.0.0.1:25080' })).toThrow(/SIP_WS_ORIGINS/);
    expect(() => loadSipSettings({ ...base, SIP_WS_LISTEN: 'http:127.0.0.1:25080', SIP_WS_ORIGINS: 'https://a.example' })).toThrow(
      /SIP_WS_LISTEN/,
    );
    expect(() => loadSipSettings({ ...base, SIP_WS_LISTEN: 'wss:0.0.0.0:8443', SIP_WS_ORIGINS: 'https://a.example' })).toThrow(
      /SIP_TLS_CERT/,
    );
    expect(() => loadSipSettings({ ...base, SIP_WS_LISTEN: 'ws:127.0.0.1:25080', SIP_WS_ORIGINS: 'https://a.example/"x' })).toThrow(
      /SIP_WS_ORIGINS/,
    );
    expect(() =>
      loadSipSettings({ SIP_LISTEN: 'tcp:0.0.0.0:5060', SIP_WS_LISTEN: 'ws:127.0.0.1:5060', SIP_WS_ORIGINS: 'https://a.example' }),
    ).toThrow(/shares its port/);
  });

  it('renders the websocket modules, the WebSocket sockets, the handshake only there and the Origin check', () => {
    const settings = loadSipSettings({
      ...base,
      SIP_WS_LISTEN: 'ws:127.0.0.1:25080,ws:0.0.0.0:25081',
      SIP_WS_ORIGINS: 'https://console.example.com',
    });
    const rendered = renderKamailioConfig({ settings, databaseUrl: 'postgres://postgres@127.0.0.1:5432/parley', runDir: '/tmp/x' });
    expect(rendered).toMatch(/^#!define WITH_WS$/m);
    expect(rendered).toContain('listen=udp:127.0.0.1:25999\nlisten=tcp:127.0.0.1:25080\nlisten=tcp:0.0.0.0:25081');
    expect(rendered).toContain('disable_tcp=no');
    expect(rendered).toContain('if (!(($Rp == 25080 && $pr == "tcp" && $Ri == "127.0.0.1") || ($Rp == 25081 && $pr == "tcp"))) {');
    expect(rendered).toContain('if (!($hdr(Origin) == "https://console.example.com")) {');
    const none = renderKamailioConfig({
      settings: loadSipSettings(base),
      databaseUrl: 'postgres://postgres@127.0.0.1:5432/parley',
      runDir: '/tmp/x',
    });
    expect(none).not.toMatch(/^#!define WITH_WS$/m);
    expect(none).toContain('if ((0) && !(proto == WS || proto == WSS)) {');
  });

  it.skipIf(!haveProgram('kamailio'))('is accepted by Kamailio with ws and wss listeners (kamailio -c)', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'parley-sipws-'));
    // Empty files do: the check parses the configuration and loads no certificate.
    const [cert, key] = ['cert.pem', 'key.pem'].map((f) => path.join(dir, f));
    for (const f of [cert, key]) fs.writeFileSync(f, '');
    const settings = loadSipSettings({
      ...base,
      SIP_WS_LISTEN: 'ws:127.0.0.1:25080,wss:127.0.0.1:25443',
      SIP_WS_ORIGINS: 'https://console.example.com',
      SIP_TLS_CERT: cert,
      SIP_TLS_KEY: key,
    });
    const file = path.join(dir, 'kamailio.cfg');
    fs.writeFileSync(file, renderKamailioConfig({ settings, databaseUrl: 'postgres://postgres@127.0.0.1:5432/parley', runDir: dir }));
    const { stderr, stdout } = await run('kamailio', ['-c', '-f', file]);
    expect(stdout + stderr).toContain('config file ok');
    fs.rmSync(dir, { recursive: true, force: true });
  });
});
