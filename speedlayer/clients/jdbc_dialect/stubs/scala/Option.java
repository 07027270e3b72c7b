package scala;

public abstract class Option<A> {
    public static <A> Option<A> apply(A x) {
        return null;
    }

    public static <A> Option<A> empty() {
        return null;
    }
}
