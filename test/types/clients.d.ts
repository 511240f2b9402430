// The client libraries below ship no type declarations; the tests use them as plain JavaScript.
declare module 'devour-client';
declare module 'jsonapi-serializer';
