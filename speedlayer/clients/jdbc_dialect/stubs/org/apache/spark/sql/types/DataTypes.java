package org.apache.spark.sql.types;

public class DataTypes {
    public static final DataType StringType = null;
    public static final DataType TimestampType = null;

    public static ArrayType createArrayType(DataType elementType) {
        return null;
    }
}
